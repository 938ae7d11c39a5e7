"""Workers that end with their launcher, even when it is killed with SIGKILL.

`strategykit launch` stops its workers when it stops, but SIGKILL ends it without a word,
and the workers (each in a process group of its own) would go on training, or wait in an
all-reduce forever. So on Linux the launcher starts each worker through this file, run
as a script: `python orphan_guard.py LAUNCHER_PID NETWORK COMMAND...`. It asks the
kernel for SIGKILL when its parent dies (`prctl(PR_SET_PDEATHSIG)`), exits at once if the
launcher is gone already, joins the job's private network (`private_network`; NETWORK is
its keeper's pid, `-` for the machine's network), then becomes COMMAND (`os.execvp`: the
same process, pid and process group; the request survives the exec), or exits with
one of `worker_contract`'s codes. Run as a script it imports nothing of strategykit but
its siblings `private_network` and `worker_contract`, so no TensorFlow: it adds a few
milliseconds to a worker's start. Elsewhere than Linux the command runs as it is,
unguarded.

Example:
    >>> import os
    >>> guarded(["python", "train.py"], launcher_pid=1234)[2:]  # doctest: +SKIP
    ['1234', '-', 'python', 'train.py']
"""

from __future__ import annotations

import ctypes
import os
import sys

_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
_SIGKILL = 9


def guarded(command: list[str], launcher_pid: int, network_pid: int | None = None) -> list[str]:
    """The command line that runs `command` as a worker that dies with `launcher_pid`.

    Args:
        command: the worker's program and its arguments.
        launcher_pid: the process that starts the worker (its parent).
        network_pid: the keeper of the job's private network (`private_network`) for the
            worker to join; None: the machine's network.

    Returns:
        `[python, this file, launcher_pid, network_pid or "-", *command]` on Linux;
        `command` elsewhere (where there is no private network either).
    """
    if not sys.platform.startswith("linux"):
        return list(command)
    network = "-" if network_pid is None else str(network_pid)
    return [sys.executable, os.path.abspath(__file__), str(launcher_pid), network, *command]


def die_with_parent() -> None:
    """Asks the kernel for SIGKILL to this process when its parent dies (Linux)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, _SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")


def main(argv: list[str]) -> None:
    """Sets the parent-death signal, joins the job's network, then becomes the command."""
    # Run as a script: its siblings are top-level modules, no package (no TensorFlow).
    from worker_contract import CANNOT_START, LAUNCHER_GONE, NO_PRIVATE_NETWORK

    launcher_pid, network, command = int(argv[0]), argv[1], argv[2:]
    die_with_parent()
    if os.getppid() != launcher_pid:  # the launcher died before the request was made
        sys.exit(LAUNCHER_GONE)
    if network != "-":
        from private_network import join

        try:
            join(int(network))
        except OSError as error:
            print(f"strategykit launch: {error.strerror or error}", file=sys.stderr)
            sys.exit(NO_PRIVATE_NETWORK)
    try:
        os.execvp(command[0], command)
    except OSError as error:
        print(f"strategykit launch: cannot start {command[0]!r}: {error.strerror}",
              file=sys.stderr)
        sys.exit(CANNOT_START)


if __name__ == "__main__":
    main(sys.argv[1:])
