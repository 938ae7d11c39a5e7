"""What a worker process is doing, as the kernel tells it: running, stopped, frozen.

The launcher names the worker at fault by what its process does, not only by what its
peers say about it. On Linux `/proc/<pid>/stat` holds the process's state letter (`R`
running, `S` sleeping, `D` waiting in the kernel, `T` stopped, `t` stopped by a
debugger, `Z` exited but not yet reaped); elsewhere the state is unknown (None) and the
launcher falls back on the progress reports. Standard library only: the launcher imports
no TensorFlow.

Example:
    >>> import os
    >>> process_state(os.getpid())  # doctest: +SKIP
    'R'
    >>> is_stopped("T"), is_stopped("S")
    (True, False)
    >>> describe("T")
    'stopped (process state T: a SIGSTOP or Ctrl-Z)'
"""

from __future__ import annotations

_MEANINGS = {
    "T": "stopped (process state T: a SIGSTOP or Ctrl-Z)",
    "t": "stopped by a debugger (process state t)",
    "D": "frozen in the kernel (process state D: a hung disk or network file system, or a "
         "paused container)",
    "Z": "exited (process state Z)",
    "X": "exited (process state X)",
}


def process_state(pid: int) -> str | None:
    """The state letter of process `pid`; None when it is gone or the system has no /proc."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            # The command name, in parentheses, may itself hold spaces and parentheses.
            return stat.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def is_stopped(state: str | None) -> bool:
    """Whether a process in `state` cannot run until someone continues it."""
    return state in ("T", "t")


def describe(state: str | None) -> str:
    """What a process in `state` does, in words, for the launcher's messages."""
    if state in _MEANINGS:
        return _MEANINGS[state]
    return "running" if state else "of unknown state"
