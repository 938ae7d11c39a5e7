"""Worker processes on loopback for the multi-worker tests: a test may fail, never hang.

`run_workers(source, workers=N)` runs a Python script as N worker processes, each with
its `TF_CONFIG` on free loopback ports (as `strategykit launch` gives it) and its own
process group. When any worker is
still running after `timeout` seconds, every worker's whole process group is killed
(a collective whose peer died waits forever otherwise) and the test fails with every
worker's output.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

from strategykit.cluster.launch import signal_groups
from strategykit.cluster.worker_env import free_ports, worker_env

TESTS = os.path.dirname(os.path.abspath(__file__))
TEST_PATHS = [TESTS, *sorted(entry.path for entry in os.scandir(TESTS)
                             if entry.is_dir() and not entry.name.startswith(("_", ".")))]
"""The tests folder and each part's folder: a worker script imports test modules by name."""


@dataclasses.dataclass
class Finished:
    """One worker process that has ended."""

    index: int
    returncode: int
    stdout: str
    stderr: str

    def last_json(self):
        """The last line of stdout, read as JSON (the worker's report)."""
        return json.loads(self.stdout.strip().splitlines()[-1])


def run_workers(source: str, workers: int = 2, *, args=(), timeout: float = 240,
                env: dict | None = None, tmp_path=None, check: bool = True) -> list[Finished]:
    """Runs `source` (Python, dedented) as `workers` worker processes; returns them ended.

    The script can `import` the test modules (every test folder is on its path). With
    `check`, a worker that exits non-zero fails the test with its output.
    """
    script = os.path.join(str(tmp_path or TESTS), f"worker_{os.getpid()}_{time.time_ns()}.py")
    with open(script, "w") as file:
        file.write(f"import sys\nsys.path[:0] = {TEST_PATHS!r}\n" + textwrap.dedent(source))
    ports = free_ports(workers)
    processes = []
    try:
        for index in range(workers):
            base = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})}
            processes.append(subprocess.Popen(
                [sys.executable, script, *map(str, args)], text=True,
                env=worker_env(index, 0, ports, None, base),
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True))
        deadline = time.monotonic() + timeout
        outputs = []
        for process in processes:
            try:
                outputs.append(process.communicate(timeout=max(1, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                _kill(processes)
                details = [p.communicate() for p in processes]
                raise AssertionError(f"workers still running after {timeout} s, killed:\n"
                                     + _describe(processes, details)) from None
    finally:
        _kill(processes)
        if tmp_path is None:
            os.remove(script)
    finished = [Finished(i, p.returncode, out, err)
                for i, (p, (out, err)) in enumerate(zip(processes, outputs))]
    if check and any(f.returncode != 0 for f in finished):
        raise AssertionError("a worker failed:\n" + _describe(processes, outputs))
    return finished


def _kill(processes) -> None:
    signal_groups(processes, signal.SIGKILL)
    for process in processes:
        process.wait()


def _describe(processes, outputs) -> str:
    return "\n".join(f"--- worker {i} (exit {p.returncode}):\n{out[-2000:]}\n{err[-4000:]}"
                     for i, (p, (out, err)) in enumerate(zip(processes, outputs)))
