"""The files `strategykit launch` writes: in a folder of its own, opened safely.

Everything the launcher writes on disk goes into one folder made for it by
`tempfile.mkdtemp` (a name nobody can guess, created atomically, mode 0700, in
`TMPDIR` or the system's temporary folder): each attempt's folder for the workers'
progress reports (`progress_file`) and the log files of error output that only echoes
the worker at fault (`held_output.set_aside_echoes`). A file in it is created with
`O_CREAT | O_EXCL | O_NOFOLLOW`, mode 0600: never a file that existed before, never
through a symbolic link. The folder is removed when the launcher ends, unless it holds a
log file that a message of the launcher named (then only the logs stay, and the folder
with them). Standard library only: the launcher imports no TensorFlow.

Example:
    >>> import os, stat
    >>> folder = RunFolder()
    >>> with open_private(folder.log_path(0)) as log:
    ...     _ = log.write("[worker 0] Traceback (most recent call last):\\n")
    >>> oct(stat.S_IMODE(os.stat(folder.path).st_mode)), oct(stat.S_IMODE(
    ...     os.stat(folder.log_path(0)).st_mode))
    ('0o700', '0o600')
    >>> folder.close() == [folder.log_path(0)]  # a log was written: it stays
    True
    >>> import shutil; shutil.rmtree(folder.path)
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import TextIO

PRIVATE_FILE_MODE = 0o600
"""The mode of every file the launcher creates."""
PRIVATE_FOLDER_MODE = 0o700
"""The mode of every folder the launcher creates."""
_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(
    os, "O_CLOEXEC", 0)


def open_private(path: str) -> TextIO:
    """Creates the file `path`, mode 0600, and opens it for writing text.

    Args:
        path: a file that does not exist yet.

    Returns:
        The open file (UTF-8).

    Raises:
        OSError: `path` exists already, as a file, a folder or a symbolic link (even a
            dangling one): nothing is written to it, nothing it points to is touched.
    """
    descriptor = os.open(path, _FLAGS, PRIVATE_FILE_MODE)
    return os.fdopen(descriptor, "w", encoding="utf-8")


class RunFolder:
    """The launcher's own folder: made when the launcher starts, removed when it ends.

    Attributes:
        path: the folder, `strategykit-launch-XXXXXXXX` in the temporary folder.
    """

    def __init__(self):
        self.path = tempfile.mkdtemp(prefix="strategykit-launch-")

    def attempt_folder(self, attempt: int) -> str:
        """Creates the folder of attempt `attempt`'s progress reports (mode 0700).

        Raises:
            OSError: it exists already (made by someone else in the launcher's folder).
        """
        folder = os.path.join(self.path, f"attempt-{attempt}-progress")
        os.mkdir(folder, PRIVATE_FOLDER_MODE)
        return folder

    def log_path(self, attempt: int) -> str:
        """Where attempt `attempt`'s error output that only echoes a fault goes."""
        return os.path.join(self.path, f"attempt-{attempt}.log")

    def close(self) -> list[str]:
        """Removes the folder, unless it holds log files: then only those stay.

        Returns:
            The log files kept, for the messages that named them.
        """
        kept = []
        try:
            names = sorted(os.listdir(self.path))
        except OSError:  # removed already
            return kept
        for name in names:
            entry = os.path.join(self.path, name)
            if name.endswith(".log") and os.path.isfile(entry) and not os.path.islink(entry):
                kept.append(entry)
            elif os.path.isdir(entry) and not os.path.islink(entry):
                shutil.rmtree(entry, ignore_errors=True)
            else:
                _remove(entry)
        if not kept:
            _remove(self.path)
        return kept


def _remove(path: str) -> None:
    try:
        os.rmdir(path) if os.path.isdir(path) and not os.path.islink(path) else os.remove(path)
    except OSError:
        pass
