"""Worker processes on loopback for the multi-worker tests: a test may fail, never hang.

`run_workers(source, workers=N)` runs a Python script as N worker processes, each with
its `TF_CONFIG` on free loopback ports (as `strategykit launch` gives it) and its own
process group, forked from a server that has imported TensorFlow already
(`forked_workers`: that import costs about 8 s of CPU a process here). When any worker is
still running after `timeout` seconds, every worker's whole process group is killed
(a collective whose peer died waits forever otherwise) and the test fails with every
worker's output.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import tempfile
import textwrap
import time

from forked_workers import forks

from strategykit.launcher.worker_env import free_ports, worker_env

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
    folder = str(tmp_path) if tmp_path is not None else tempfile.mkdtemp(prefix="workers-")
    script = os.path.join(folder, f"worker_{os.getpid()}_{time.time_ns()}.py")
    with open(script, "w") as file:
        file.write(f"import sys\nsys.path[:0] = {TEST_PATHS!r}\n" + textwrap.dedent(source))
    ports = free_ports(workers)
    base = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})}
    envs = [worker_env(index, 0, ports, None, base) for index in range(workers)]
    try:
        return run_processes(script, envs, args=args, timeout=timeout, check=check,
                             teardown=False)
    finally:
        if tmp_path is None:
            shutil.rmtree(folder, ignore_errors=True)


def run_processes(script: str, envs: list[dict], *, args=(), timeout: float = 240,
                  check: bool = True, teardown: bool = True) -> list[Finished]:
    """Runs `python script args...` once per environment of `envs`, each in a session of
    its own, forked from this test process's fork server (`forked_workers`, which has
    imported TensorFlow already); returns them ended, their output read from files
    beside `script`. When any is still running after `timeout` seconds, every one's
    process group is killed and the test fails with their output. `teardown=False`:
    each ends without the interpreter's teardown (`Forks.start`)."""
    server = forks()
    pids: list[int] = []
    outputs = [(f"{script}.{index}.out", f"{script}.{index}.err") for index in range(len(envs))]
    try:
        for env, (out, err) in zip(envs, outputs):
            pids.append(server.start(script, args, env, out, err, teardown=teardown))
        deadline = time.monotonic() + timeout
        returncodes = [server.wait(pid, deadline) for pid in pids]
    finally:
        _kill(pids)  # never leave a worker waiting in a collective
    if None in returncodes:
        returncodes = [server.wait(pid, time.monotonic() + 30) if code is None else code
                       for pid, code in zip(pids, returncodes)]
        raise AssertionError(f"workers still running after {timeout} s, killed:\n"
                             + _describe(_finished(returncodes, outputs)))
    finished = _finished(returncodes, outputs)
    if check and any(f.returncode != 0 for f in finished):
        raise AssertionError("a worker failed:\n" + _describe(finished))
    return finished


def _finished(returncodes, outputs) -> list[Finished]:
    texts = []
    for out, err in outputs:
        texts.append(tuple(open(path).read() if os.path.exists(path) else ""
                           for path in (out, err)))
    return [Finished(i, code, out, err)
            for i, (code, (out, err)) in enumerate(zip(returncodes, texts))]


def _kill(pids) -> None:
    """SIGKILL to each worker's process group (a group that is gone is skipped)."""
    for pid in pids:
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _describe(finished) -> str:
    return "\n".join(f"--- worker {f.index} (exit {f.returncode}):\n{f.stdout[-2000:]}\n"
                     f"{f.stderr[-4000:]}" for f in finished)
