"""What starting `strategykit launch` costs the launcher process itself: CPU and memory.

The launcher only starts, watches and restarts worker processes, and imports neither
TensorFlow nor Keras (`strategykit_console.py`); a process that imports strategykit (as
the launcher did before) pays TensorFlow's import. Each pair runs, in fresh processes
and alternating, `strategykit launch --workers 1 -- python -c pass` (a worker that does
nothing, so what is measured is the launcher) and `python -c "import strategykit"`, and
reads each one's CPU seconds and peak memory from the operating system. The worker's own
small cost is included in the launcher's figures.

    python benchmarks/launcher_start.py --pairs 5
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys

VARIANTS = {
    "strategykit launch": [sys.executable, "-m", "strategykit_console", "launch", "--workers",
                           "1", "--", sys.executable, "-c", "pass"],
    "import strategykit": [sys.executable, "-c", "import strategykit"],
}


def _run(command: list[str]) -> tuple[float, float]:
    """CPU seconds and peak resident MB of `command` and its children (waited for)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(command, check=True, capture_output=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return cpu, after.ru_maxrss / 1024  # the largest child so far: runs go small first


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=5)
    args = parser.parse_args()
    cpu = {name: [] for name in VARIANTS}
    # Peak memory of the children so far only grows, so measure the launcher's first.
    _, launcher_mb = _run(VARIANTS["strategykit launch"])
    for _ in range(args.pairs):
        for name, command in VARIANTS.items():
            cpu[name].append(_run(command)[0])
    _, import_mb = _run(VARIANTS["import strategykit"])
    print(f"CPU seconds, median (min to max) of {args.pairs}:")
    for name, seconds in cpu.items():
        print(f"  {name:20} {statistics.median(seconds):5.2f} "
              f"({min(seconds):.2f} to {max(seconds):.2f})")
    print(f"peak memory: strategykit launch {launcher_mb:.0f} MB, "
          f"import strategykit {import_mb:.0f} MB")


if __name__ == "__main__":
    main()
