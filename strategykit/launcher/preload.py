"""`strategykit launch --preload`: workers forked from a process that imported TensorFlow.

A worker of `python train.py` spends its first seconds importing TensorFlow and Keras
(about 9 s of CPU on a 2-core machine), and every worker of a job does so at once, at
each start and restart. With `--preload` the launcher starts one server per job
(`preload_server`, run by the command's own Python, in the job's network, dying with the
launcher as the workers do) that imports TensorFlow, Keras and strategykit once and then
forks every worker of every attempt from itself, as gunicorn's `--preload` does: a
worker, or a whole restart, starts in milliseconds. The server starts nothing of
TensorFlow's runtime (no device list, no context, no GPU): each worker starts its own,
with its own `TF_CONFIG` and `CUDA_VISIBLE_DEVICES`.

A forked worker is what `python train.py ARGS` (or `python -m module ARGS`) would be: a
process group and session of its own, the worker's environment, stdin from /dev/null,
stdout and stderr to the launcher, `sys.argv`, `sys.path[0]`, `__main__`, `atexit` and
the interpreter's teardown at exit, the exit code (negative when a signal killed it),
NumPy's global random state seeded anew. What differs:

- TensorFlow, Keras and strategykit are imported before the script's first line. An
  environment variable they read when imported (`KERAS_BACKEND`, say) that the script
  sets before importing them comes too late: set it where the launcher runs instead.
- The worker's parent is the server, not the launcher.
- Every worker has the server's `hash()` seed.

This module, the launcher's side, imports no TensorFlow.

Example:
    >>> preloadable(["python", "train.py", "--epochs", "3"])
    True
    >>> preloadable(["bash", "train.sh"])
    False
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence

from strategykit.launcher.orphan_guard import guarded

READY_SECONDS = 300.0
"""How long the server may take to import TensorFlow, Keras and strategykit."""
_PYTHON = re.compile(r"python[\d.]*")
_MESSAGE_BYTES = 1 << 16


def preloadable(command: Sequence[str]) -> bool:
    """Whether `command` runs a Python script or module that `--preload` can fork:
    `python SCRIPT ARGS...` or `python -m MODULE ARGS...` (any `python3.X`, any path)."""
    if len(command) < 2 or not _PYTHON.fullmatch(os.path.basename(command[0])):
        return False
    if command[1] == "-m":
        return len(command) >= 3
    return not command[1].startswith("-")


class Preloader:
    """The preload server of one job: forks workers, tells when each has ended.

    Args:
        command: the workers' command, `python SCRIPT ARGS...` or `python -m MODULE ...`.
        network_pid: the keeper of the job's private network, None for the machine's.
        env: the server's environment (the workers' without what is each worker's own).

    Raises:
        ValueError: `command` runs no Python script or module, or its Python cannot
            import TensorFlow, Keras and strategykit (the server's error included).
    """

    def __init__(self, command: Sequence[str], network_pid: int | None,
                 env: Mapping[str, str]):
        if not preloadable(command):
            raise ValueError(
                f"--preload forks Python workers: the command must be `python SCRIPT "
                f"ARGS...` or `python -m MODULE ARGS...`. Received: command={list(command)}. "
                "Leave --preload out to run this command as it is.")
        self._python, self._target = command[0], list(command[1:])
        self._channel, server_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._log = tempfile.TemporaryFile()
        server = [command[0], "-m", "strategykit.launcher.preload_server",
                  str(server_end.fileno())]
        try:  # the launcher has checked that the command's program can start
            self._server = subprocess.Popen(
                guarded(server, os.getpid(), network_pid), env=dict(env),
                stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log,
                pass_fds=(server_end.fileno(),), start_new_session=True)
        finally:
            server_end.close()
        self._started: list[int] = []
        self._ended: dict[int, int] = {}
        self.gone = False
        """Whether the server ended while the job ran (its workers were killed with it)."""
        try:
            self._reply(lambda message: message.get("ready"), READY_SECONDS)
        except ValueError:
            self.close()  # nothing of a server that failed is left running
            raise

    def start(self, env: Mapping[str, str]) -> ForkedWorker:
        """Forks a worker with environment `env`; it starts at once."""
        out_read, out_write = os.pipe()
        err_read, err_write = os.pipe()
        request = json.dumps({"command": self._target, "env": dict(env)}).encode()
        try:
            socket.send_fds(self._channel, [request], [out_write, err_write])
        except OSError as error:  # a server killed while the job ran
            raise self._failed("the preload server ended") from error
        finally:
            os.close(out_write)
            os.close(err_write)
        pid = self._reply(lambda message: "started" in message, READY_SECONDS)["started"]
        self._started.append(pid)
        return ForkedWorker(self, pid, out_read, err_read)

    def returncode(self, pid: int, timeout: float = 0.0) -> int | None:
        """Worker `pid`'s exit code (as `Popen.returncode`), or None while it runs (waits
        up to `timeout` seconds for it)."""
        if pid not in self._ended:
            self._reply(lambda message: message.get("ended") == pid, timeout, wait=False)
        return self._ended.get(pid)

    @property
    def pid(self) -> int:
        """The server's process id."""
        return self._server.pid

    def close(self) -> None:
        """Ends the server (its workers must have ended) and its channel."""
        self._channel.close()
        try:
            self._server.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._server.kill()
            self._server.wait()
        self._log.close()

    def _reply(self, wanted, timeout: float, wait: bool = True) -> dict | None:
        """The next message from the server that `wanted` accepts, or None after
        `timeout` seconds when not `wait` (a ValueError when `wait`)."""
        deadline = time.monotonic() + timeout
        while True:
            readable, _, _ = select.select([self._channel], [], [],
                                           max(0.0, deadline - time.monotonic()))
            if not readable:
                if not wait:
                    return None
                raise self._failed(f"the preload server did not answer in {timeout:.0f} s")
            data = self._channel.recv(_MESSAGE_BYTES)
            if not data:  # its workers were killed with it (PR_SET_PDEATHSIG)
                self.gone = True
                self._ended = {pid: -signal.SIGKILL for pid in self._started} | self._ended
                if not wait:
                    return None
                raise self._failed("the preload server ended")
            message = json.loads(data)
            if "ended" in message:
                self._ended[message["ended"]] = message["returncode"]
            if wanted(message):
                return message

    def _failed(self, what: str) -> ValueError:
        self._log.seek(0)
        output = self._log.read().decode(errors="replace").strip()[-3000:]
        return ValueError(f"{what}: it imports TensorFlow, Keras and strategykit with the "
                          f"command's Python, {self._python!r}, before forking the "
                          f"workers. Its output:\n{output}\nLeave --preload out, or install "
                          "strategykit for that Python.")


class ForkedWorker:
    """A worker forked by the preload server: what the launcher uses of `subprocess.Popen`.

    Attributes:
        pid: its process id, also its process group's and session's.
        stdout: the read end of its standard output.
        stderr: the read end of its standard error.
        returncode: None while it runs, then its exit code (-N: killed by signal N).
    """

    def __init__(self, server: Preloader, pid: int, stdout: int, stderr: int):
        self._server = server
        self.pid = pid
        self.stdout = os.fdopen(stdout, "rb")
        self.stderr = os.fdopen(stderr, "rb")
        self.returncode: int | None = None

    def poll(self) -> int | None:
        self.returncode = self._server.returncode(self.pid)
        return self.returncode

    def wait(self) -> int:
        while self.poll() is None:
            self._server.returncode(self.pid, timeout=0.05)
        return self.returncode
