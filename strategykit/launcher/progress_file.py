"""A worker's progress as `strategykit launch` watches it: one small JSON file a worker.

The launcher names each worker's file in the environment variable
`STRATEGYKIT_PROGRESS_FILE` (`worker_contract.PROGRESS_FILE_VARIABLE`). The file holds
the worker's last completed training step (`epoch` and `step`, both counted from 1 as
Keras's progress bar shows them), when it made progress last (`progress`: a step or an
evaluation batch) and when it last showed it is alive (`heartbeat`, written every
`HEARTBEAT_SECONDS` by a thread of its own), and how many `fit()`, `evaluate()` or
`predict()` calls it is in (`calls`; 0 before, between and after them, when the worker
makes no training progress by design: it saves a model, writes a report, exits). A
stopped or frozen process stops both times; a worker that waits (a stuck input pipeline,
a peer that hangs) only the first. Steps only update memory; the heartbeat thread
writes, whole (a temporary file, renamed), so the launcher reads a complete file at any
time and training pays no file write a step. This module uses the standard library only:
the launcher imports it too.

The path is the environment's to name, so a worker writes it without trusting it: each
write creates a new temporary file beside it (`tempfile.mkstemp`: `O_EXCL`, mode 0600)
and renames it over the path (`os.replace`, which replaces a name, never writes through
a link). A path that is a symbolic link, a folder or anything but a regular file, or a
file that is not this user's progress report (a JSON report with a `heartbeat`), is
refused (`ValueError`) rather than replaced: the file may be absent or a report of an
earlier run, nothing else. The launcher names a path in its own private folder
(`private_files`), where no one else can create anything, and reads a report without
following a link either.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
import threading
import time

from strategykit.launcher.worker_contract import PROGRESS_FILE_VARIABLE

HEARTBEAT_SECONDS = 1.0
"""How often a worker writes its file."""


class ProgressFile:
    """The worker's side: records progress in memory, writes it with every heartbeat.

    Args:
        path: the file to write (the launcher's `STRATEGYKIT_PROGRESS_FILE`).

    Example:
        >>> import os, tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "worker-0.json")
        >>> progress = ProgressFile(path)
        >>> progress.record(epoch=1, step=3)
        >>> progress.write()
        >>> read(path)["step"]
        3

    Raises:
        ValueError: `path` is a symbolic link, a folder or another file than a progress
            report of this user's, or its folder does not exist.
    """

    def __init__(self, path: str):
        check_path(path)
        self.path = path
        self._state = {"epoch": None, "step": None, "progress": None, "calls": 0}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def record(self, epoch: int | None = None, step: int | None = None) -> None:
        """Notes progress now; `epoch` and `step` (from 1) when a training step ended."""
        state = {"progress": time.time()}
        if step is not None:
            state.update(epoch=epoch, step=step)
        with self._lock:
            self._state.update(state)

    def enter_call(self) -> None:
        """Notes that a `fit()`, `evaluate()` or `predict()` call begins (they may nest)."""
        with self._lock:
            self._state["calls"] += 1
            self._state["progress"] = time.time()

    def leave_call(self) -> None:
        """Notes that the call begun last ended."""
        with self._lock:
            self._state["calls"] = max(0, self._state["calls"] - 1)
            self._state["progress"] = time.time()

    def write(self) -> None:
        """Writes the file now, whole, with a fresh heartbeat."""
        with self._lock:
            data = {**self._state, "heartbeat": time.time()}
        folder, name = os.path.split(os.path.abspath(self.path))
        descriptor, temporary = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder)
        try:
            with os.fdopen(descriptor, "w") as file:
                json.dump(data, file)
            check_path(self.path)  # still ours: nothing planted since the last write
            os.replace(temporary, self.path)
        except BaseException:
            os.remove(temporary)
            raise

    def start_heartbeat(self) -> None:
        """Writes the file every `HEARTBEAT_SECONDS` from a daemon thread (idempotent)."""
        if self._thread is not None:
            return

        def beat() -> None:
            while True:
                try:
                    self.write()
                except (OSError, ValueError):  # the folder is gone (the launcher stopped
                    return  # the job), or something was planted at the path
                time.sleep(HEARTBEAT_SECONDS)

        self._thread = threading.Thread(target=beat, daemon=True,
                                        name="strategykit-heartbeat")
        self._thread.start()


def check_path(path: str) -> None:
    """Raises the ValueError of a path a worker must not write its progress to.

    A path is fine when nothing is there yet (in a folder that exists), or when it is a
    regular file of this user's holding a progress report (an earlier run's).

    Raises:
        ValueError: what is at `path` and why it is refused, and the fix.
    """
    fix = (f"Name a path where nothing is yet, in a folder of your own, or leave "
           f"{PROGRESS_FILE_VARIABLE} unset (strategykit launch sets it, in a private folder).")
    try:
        status = os.lstat(path)
    except FileNotFoundError:
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder):
            raise ValueError(f"{PROGRESS_FILE_VARIABLE} names a file in a folder that does "
                             f"not exist. Received: {path!r}. {fix}") from None
        return
    if stat.S_ISLNK(status.st_mode):
        what = f"a symbolic link (to {os.readlink(path)!r}), which it would not follow"
    elif stat.S_ISDIR(status.st_mode):
        what = "a folder"
    elif not stat.S_ISREG(status.st_mode):
        what = "no regular file"
    elif status.st_uid != os.getuid():
        what = f"a file of another user's (uid {status.st_uid}), which it would replace"
    elif _report(path) is None:
        what = "a file that is no progress report, which it would replace"
    else:
        return
    raise ValueError(f"{PROGRESS_FILE_VARIABLE} names {what}. Received: {path!r}. {fix}")


def read(path: str) -> dict | None:
    """The launcher's side: a worker's last written progress; None before its first
    (or when what is at `path` is a link, a folder or no report)."""
    return _report(path)


def _report(path: str) -> dict | None:
    """The progress report at `path`, read without following a link or waiting on a
    FIFO; None where there is none."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    try:
        with os.fdopen(descriptor) as file:
            if not stat.S_ISREG(os.fstat(descriptor).st_mode):
                return None
            report = json.load(file)
    except (OSError, ValueError):
        return None
    return report if isinstance(report, dict) and "heartbeat" in report else None
