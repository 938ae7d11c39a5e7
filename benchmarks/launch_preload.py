"""What `strategykit launch --preload` saves: a job's start and its restart, whole.

Each pair runs, in fresh launchers and alternating, one job of 2 workers with one
restart, with and without `--preload`: every worker imports strategykit, builds its
`MultiWorkerMirroredStrategy` with `sk.from_env()` and runs one all-reduce; in the first
attempt worker 1 then exits 1, and the launcher starts the job again. Reported per
variant, median (min to max): the whole command until it returns, the CPU seconds of the
launcher and everything it started, the time from the launcher's start until both
workers' strategies are built, and the restart: from worker 1's exit until both workers of
the second attempt have built theirs.

    python benchmarks/launch_preload.py --pairs 5
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

WORKER = """
import os, sys, time
import strategykit as sk
import tensorflow as tf

attempt, k = os.environ["STRATEGYKIT_RESTART"], os.environ["STRATEGYKIT_WORKER"]
strategy = sk.from_env()
strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None)
with open(os.path.join(sys.argv[1], f"built-{attempt}-{k}"), "w") as file:
    file.write(str(time.time()))
if (attempt, k) == ("0", "1"):
    with open(os.path.join(sys.argv[1], "failed"), "w") as file:
        file.write(str(time.time()))
    sys.exit(1)
"""


def _run(preload: bool, folder: str) -> dict[str, float]:
    """One job: its figures in seconds."""
    for name in os.listdir(folder):
        os.remove(os.path.join(folder, name))
    command = [sys.executable, "-m", "strategykit_console", "launch", "--workers", "2",
               "--restarts", "1", *(["--preload"] if preload else []), "--",
               sys.executable, os.path.join(os.path.dirname(folder), "worker.py"), folder]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.time()
    subprocess.run(command, check=True, capture_output=True)
    ended = time.time()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)

    def read(name: str) -> float:
        with open(os.path.join(folder, name)) as file:
            return float(file.read())

    return {"whole command": ended - started,
            "CPU seconds": (after.ru_utime + after.ru_stime)
            - (before.ru_utime + before.ru_stime),
            "start to strategies built": max(read(f"built-0-{k}") for k in "01") - started,
            "restart": max(read(f"built-1-{k}") for k in "01") - read("failed")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=5)
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="launch-preload-")
    with open(os.path.join(root, "worker.py"), "w") as file:
        file.write(WORKER)
    folder = os.path.join(root, "out")
    os.mkdir(folder)
    runs: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    for _ in range(args.pairs):
        for preload in (False, True):
            runs[preload].append(_run(preload, folder))
    print(f"2 workers, 1 restart; median (min to max) of {args.pairs} jobs each:")
    for figure in runs[False][0]:
        print(f"  {figure}:")
        for preload in (False, True):
            values = [run[figure] for run in runs[preload]]
            print(f"    {'--preload' if preload else 'as it is':10} "
                  f"{statistics.median(values):6.2f} ({min(values):.2f} to {max(values):.2f})")
        ratios = [b[figure] / a[figure] for a, b in zip(runs[False], runs[True])]
        print(f"    ratio      {statistics.median(ratios):6.2f} "
              f"({min(ratios):.2f} to {max(ratios):.2f})")


if __name__ == "__main__":
    main()
