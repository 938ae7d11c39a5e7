"""The preload server of `strategykit launch --preload` (see `preload`), run as
`python -m strategykit.launcher.preload_server FD`.

It imports TensorFlow, Keras and strategykit, says `{"ready": true}` on the channel FD
(a `SOCK_SEQPACKET` socket to the launcher), then for each request (a worker's command
and environment, with its stdout and stderr pipes attached) forks a worker, answers
`{"started": pid}`, and once the worker has ended `{"ended": pid, "returncode": code}`.
It ends when the launcher closes the channel; its workers die with it
(`PR_SET_PDEATHSIG`), as it dies with the launcher (`orphan_guard`).
"""

from __future__ import annotations

import json
import os
import runpy
import select
import signal
import socket
import sys
import traceback

from strategykit.launcher import orphan_guard
from strategykit.launcher.worker_contract import LAUNCHER_GONE

_POLL_SECONDS = 0.05
_REQUEST_BYTES = 1 << 20
_OWN_FRAMES = (__file__, runpy.__file__, "<frozen runpy>")


def serve(channel: socket.socket) -> None:
    """Forks a worker for each request until the launcher closes `channel`."""
    import keras  # noqa: F401
    import tensorflow  # noqa: F401

    import strategykit  # noqa: F401

    channel.send(json.dumps({"ready": True}).encode())
    running: set[int] = set()
    while True:
        readable, _, _ = select.select([channel], [], [], _POLL_SECONDS)
        if readable:
            request, fds, _, _ = socket.recv_fds(channel, _REQUEST_BYTES, 2)
            if not request:
                return  # the launcher is gone; the workers die with this process
            pid = os.fork()
            if pid == 0:
                channel.close()
                become_worker(json.loads(request), fds)
            for fd in fds:
                os.close(fd)
            running.add(pid)
            channel.send(json.dumps({"started": pid}).encode())
        for pid in list(running):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                running.discard(pid)
                channel.send(json.dumps(
                    {"ended": pid, "returncode": os.waitstatus_to_exitcode(status)}).encode())


def become_worker(request: dict, fds: list[int]) -> None:
    """In the forked child: becomes the worker's `python ...` command; ends the process
    as that command would (an uncaught exception: its traceback and exit code 1)."""
    server = os.getppid()
    os.setsid()
    if sys.platform.startswith("linux"):  # as the server itself (`orphan_guard`)
        orphan_guard.die_with_parent()
        if os.getppid() != server:
            os._exit(LAUNCHER_GONE)
    os.environ.clear()
    os.environ.update(request["env"])
    stdin = os.open(os.devnull, os.O_RDONLY)
    for fd, target in ((stdin, 0), (fds[0], 1), (fds[1], 2)):
        os.dup2(fd, target)
        os.close(fd)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if "numpy" in sys.modules:  # as in a fresh process (`random` is reseeded by fork)
        sys.modules["numpy"].random.seed()
    command = request["command"]
    try:
        if command[0] == "-m":
            sys.argv = [command[1], *command[2:]]  # run_module puts the file in argv[0]
            sys.path[0] = os.getcwd()
            runpy.run_module(command[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(command)
            sys.path[0] = os.path.dirname(os.path.abspath(command[0]))
            runpy.run_path(command[0], run_name="__main__")
    except Exception as error:  # as Python reports it: the worker's frames only
        tb = error.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename in _OWN_FRAMES:
            tb = tb.tb_next
        traceback.print_exception(type(error), error, tb)
        raise SystemExit(1) from None
    raise SystemExit(0)


if __name__ == "__main__":
    serve(socket.socket(fileno=int(sys.argv[1])))
