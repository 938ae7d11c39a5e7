"""The tracebacks the launcher held back: shown, or set aside when they only echo a fault.

When one worker of a job fails, the others fail after it, each with a long traceback
(an all-reduce that lost its peer) that says nothing new and buries the one that
matters. `strategykit launch` holds every worker's traceback back
(`worker_output.LineForwarder`, `hold_tracebacks`) until it knows which worker is at
fault (`fault.blame`): that worker's is shown; the others' go to a log file that the
launcher names. A traceback of a worker that goes on (a logged exception) is shown as
soon as the worker reports progress after it, or `HELD_SECONDS` later while it runs.
Standard library only: the launcher imports no TensorFlow.

Example:
    >>> import io, os, tempfile
    >>> from strategykit.launcher.worker_output import LineForwarder, Terminal
    >>> terminal = Terminal(io.StringIO(), io.StringIO())
    >>> stderrs = [LineForwarder(terminal, k, "stderr", hold_tracebacks=True)
    ...            for k in range(2)]
    >>> for forwarder in stderrs:
    ...     forwarder.feed(b"Traceback (most recent call last):\\nError\\n")
    >>> log = os.path.join(tempfile.mkdtemp(), "attempt-0.log")  # a private folder
    >>> set_aside_echoes(stderrs, at_fault=1, log_path=log, terminal=terminal)
    [0]
    >>> open(log).read()
    '[worker 0] Traceback (most recent call last):\\n[worker 0] Error\\n'
"""

from __future__ import annotations

import time

from strategykit.launcher.private_files import open_private
from strategykit.launcher.worker_output import LineForwarder, Terminal

HELD_SECONDS = 60.0
"""How late, at the latest, the traceback of a worker that goes on running is shown
(a worker that fails may take many seconds to exit: TensorFlow shuts down)."""


def show(stderrs: list[LineForwarder]) -> None:
    """Shows every traceback held back, as it was written."""
    for forwarder in stderrs:
        forwarder.release()


def show_if_going_on(stderrs: list[LineForwarder], codes: list[int | None],
                     reports: list[dict]) -> None:
    """Shows the traceback of a running worker that made progress after it (a training
    step, an evaluation batch: `progress_file`), or that still runs `HELD_SECONDS` later.

    Args:
        stderrs: each worker's stderr forwarder, worker 0 first.
        codes: each worker's exit code, None while it runs.
        reports: each worker's last progress report, `{}` before its first.
    """
    now = time.time()
    for forwarder, code, report in zip(stderrs, codes, reports):
        since = forwarder.held_since
        if code is None and since is not None and (
                (report.get("progress") or 0) > since or now - since > HELD_SECONDS):
            forwarder.release()


def set_aside_echoes(stderrs: list[LineForwarder], at_fault: int | None, log_path: str,
                     terminal: Terminal) -> list[int]:
    """Shows the traceback of the worker at fault; the others' go to `log_path`.

    The log file is created as `private_files.open_private` creates it (mode 0600, never
    through a symbolic link, never over a file that exists); where that fails, the
    others' tracebacks are shown after a note that says why.

    Args:
        stderrs: each worker's stderr forwarder, worker 0 first.
        at_fault: the worker at fault; None when none is (a hung job: every worker's
            traceback is set aside).
        log_path: the file for the others' tracebacks, written only when there are some.
        terminal: where the launcher names that file.

    Returns:
        The workers whose tracebacks were set aside.
    """
    if at_fault is not None:
        stderrs[at_fault].release()
    held = {k: forwarder.take_held() for k, forwarder in enumerate(stderrs) if k != at_fault}
    echoed = [k for k, lines in held.items() if lines]
    if not echoed:
        return []
    workers = " and ".join(f"worker {k}" for k in echoed)
    try:
        with open_private(log_path) as log:
            log.writelines(f"[worker {k}] {line}\n" for k in echoed for line in held[k])
    except OSError as error:  # something stood at its path: shown here instead
        terminal.note(f"cannot create the log file for the error output of {workers} "
                      f"({error.strerror}: {log_path}); it follows here.")
        for k in echoed:
            for line in held[k]:
                terminal.write("stderr", k, line, redraw=False, ended=True)
        return echoed
    terminal.note(f"the error output of {workers}, which follows from that, is in "
                  f"{log_path}; --verbose shows it here.")
    return echoed
