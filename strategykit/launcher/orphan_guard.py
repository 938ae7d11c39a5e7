"""Workers that end with their launcher, even when it is killed with SIGKILL.

`strategykit launch` stops its workers when it stops, but SIGKILL ends it without a word,
and the workers (each in a process group of its own) would go on training, or wait in an
all-reduce forever. So on Linux the launcher starts each worker through this file, run
as a script: `python orphan_guard.py LAUNCHER_PID NETWORK COMMAND...`. It asks the
kernel for SIGKILL when its parent dies (`prctl(PR_SET_PDEATHSIG)`), exits at once if the
launcher is gone already, joins the job's private network (`private_network`; NETWORK is
its keeper's pid, `-` for the machine's network), then becomes COMMAND (`os.execvp`: the
same process, pid and process group; the request survives the exec). Run as a script it
imports nothing of strategykit but its sibling `private_network`, so no TensorFlow: it
adds a few milliseconds to a worker's start. Elsewhere than Linux the command runs as it
is, unguarded.

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
EXIT_LAUNCHER_GONE = 143
"""The guard's exit code when the launcher died before the command started (as SIGTERM)."""
EXIT_NO_NETWORK = 126
"""The guard's exit code when the worker cannot join the job's private network."""


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
    launcher_pid, network, command = int(argv[0]), argv[1], argv[2:]
    die_with_parent()
    if os.getppid() != launcher_pid:  # the launcher died before the request was made
        sys.exit(EXIT_LAUNCHER_GONE)
    if network != "-":
        from private_network import join  # run as a script: the sibling file, no package

        try:
            join(int(network))
        except OSError as error:
            print(f"strategykit launch: {error.strerror or error}", file=sys.stderr)
            sys.exit(EXIT_NO_NETWORK)
    try:
        os.execvp(command[0], command)
    except OSError as error:
        print(f"strategykit launch: cannot start {command[0]!r}: {error.strerror}",
              file=sys.stderr)
        sys.exit(127)


if __name__ == "__main__":
    main(sys.argv[1:])
