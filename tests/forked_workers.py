"""Worker processes forked from one that has imported TensorFlow: the suite's shortcut.

A fresh Python process spends about 8 s of CPU on this machine importing TensorFlow,
Keras and strategykit: more than most multi-worker tests spend training. `Forks` starts,
once per test process, a server (this file run as a script) that imports them and then
forks each worker a test asks for. A worker is a real process in a session (and process
group) of its own, with its own environment, arguments and output files, running its
script as `python script.py` would: `sys.argv`, `sys.path[0]`, `__main__`, the exit code
(negative when a signal killed it), `atexit`. Nothing of TensorFlow's runtime starts
before the fork (no device list, no context), so each worker starts its own, reading its
own `TF_CONFIG`; Python's and NumPy's global random states are seeded anew in each.

What a fresh process does (its devices, its logging, the launcher's workers) is tested
with processes started the ordinary way; `run_workers` uses this for the rest. Its workers
end without the interpreter's teardown (`os._exit` once their threads have ended, their
`atexit` functions have run and their output is flushed): tearing down a process that
has imported TensorFlow costs about 2 s of CPU here (measured: test_multi_worker.py's
7 tests took 168 CPU-s with it, 127 without). `run_python`'s processes end as a script
does, teardown included, for the tests of what happens at exit.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time


class Forks:
    """The client of one fork server: starts workers, tells when each has ended."""

    def __init__(self):
        # The server's stderr, in a file without a name: gone with this process however it
        # ends (a test process's `atexit` does not always run).
        self._log = tempfile.TemporaryFile()
        self._server = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__)], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=self._log,
            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"})
        self._buffer = b""
        self._ended: dict[int, int] = {}
        self._read(lambda message: message.get("ready"), timeout=300)

    def start(self, script: str, args, env: dict, stdout: str, stderr: str, *,
              teardown: bool = True) -> int:
        """Forks a worker running `script` with `args` and `env`; returns its pid.

        `teardown=False`: the worker ends as `os._exit` does once its non-daemon threads
        have ended, its `atexit` functions have run and its output is flushed, without
        tearing down the interpreter (about 2 s of CPU per process here).
        """
        request = {"script": script, "args": [str(a) for a in args], "env": dict(env),
                   "stdout": stdout, "stderr": stderr, "teardown": teardown}
        self._server.stdin.write((json.dumps(request) + "\n").encode())
        self._server.stdin.flush()
        return self._read(lambda message: message.get("started"), timeout=60)["started"]

    def wait(self, pid: int, deadline: float) -> int | None:
        """The worker's exit code (-N: killed by signal N), or None at `deadline`
        (`time.monotonic()`)."""
        while pid not in self._ended:
            if self._read(lambda message: True, timeout=deadline - time.monotonic(),
                          none_at_timeout=True) is None:
                return None
        return self._ended.pop(pid)

    def close(self) -> None:
        if self._server.poll() is None:
            self._server.kill()
            self._server.wait()
        self._log.close()

    def _read(self, wanted, timeout: float, none_at_timeout: bool = False):
        """The next message from the server that `wanted` accepts; "ended" messages
        are kept for `wait`."""
        deadline = time.monotonic() + timeout
        while True:
            while b"\n" in self._buffer:
                line, self._buffer = self._buffer.split(b"\n", 1)
                message = json.loads(line)
                if "ended" in message:
                    self._ended[message["ended"]] = message["returncode"]
                if wanted(message):
                    return message
            left = deadline - time.monotonic()
            if left <= 0:
                if none_at_timeout:
                    return None
                raise AssertionError(f"the fork server did not answer in {timeout:.0f} s")
            readable, _, _ = select.select([self._server.stdout], [], [], left)
            if readable:
                chunk = os.read(self._server.stdout.fileno(), 65536)
                if not chunk:
                    self._log.seek(0)
                    raise AssertionError("the fork server ended:\n"
                                         + self._log.read().decode(errors="replace")[-3000:])
                self._buffer += chunk


_forks: list[Forks] = []


def forks() -> Forks:
    """This test process's fork server, started at the first call."""
    if not _forks:
        _forks.append(Forks())
        atexit.register(_forks[0].close)
    return _forks[0]


# The server.


def _send(message: dict) -> None:
    os.write(1, (json.dumps(message) + "\n").encode())


def _become_worker(request: dict) -> None:
    """In the forked child: becomes `python script args...` (as a worker of `strategykit
    launch --preload` does, `preload_server.become_worker`); ends the process."""
    from strategykit.launcher.preload_server import become_worker

    fds = [os.open(request[name], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
           for name in ("stdout", "stderr")]
    try:
        become_worker({"command": [request["script"], *request["args"]],
                       "env": request["env"]}, fds)
    except SystemExit as exit:
        if request["teardown"]:
            raise
        _end_without_teardown(_exit_code(exit))


def _exit_code(exit: SystemExit) -> int:
    """The process exit code `raise SystemExit(value)` gives (a message: printed, 1)."""
    if exit.code is None or isinstance(exit.code, int):
        return exit.code or 0
    print(exit.code, file=sys.stderr)
    return 1


def _end_without_teardown(code: int) -> None:
    """Ends the process as Python's exit does up to the interpreter's teardown: its
    non-daemon threads joined, its `atexit` functions run, its output flushed."""
    import atexit
    import threading

    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _serve() -> None:
    import keras  # noqa: F401
    import tensorflow  # noqa: F401

    import strategykit  # noqa: F401

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the test process's ^C is not for it
    running: set[int] = set()
    buffer = b""
    _send({"ready": True})
    while True:
        readable, _, _ = select.select([0], [], [], 0.05)
        if readable:
            chunk = os.read(0, 65536)
            if not chunk:
                return  # the test process is gone
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                request = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    _become_worker(request)
                running.add(pid)
                _send({"started": pid})
        for pid in list(running):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                running.discard(pid)
                _send({"ended": pid, "returncode": os.waitstatus_to_exitcode(status)})


if __name__ == "__main__":
    _serve()
