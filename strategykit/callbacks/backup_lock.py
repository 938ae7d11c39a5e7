"""One training run at a time per `backup_dir`: `acquire` and `release`.

Two runs writing one `backup_dir` would undo each other: each starts by clearing the
other's backup in progress (`.writing`), each numbers its backups after the other's and
deletes the older ones, and a resume could load the other run's weights. So the writer of
`backup_dir` (the chief) holds an exclusive lock on `backup_dir/.lock` from the start of
`fit()` to its end, and a second run is refused, naming the process that holds it.

The lock is `flock(2)`'s: the system releases it when its process ends, however it ends
(a SIGKILL, a lost machine's restart), so a killed run never leaves a stale lock behind
and the same command goes on at once; a process forked during `fit()` does not inherit
it. It stays with a process whose `fit()` ended by an exception (Keras then calls no
`on_train_end`), and a later `fit()` of that process on the same `backup_dir` takes it
over: a notebook can interrupt a run and start it again.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import time
import warnings

try:
    import fcntl
except ImportError:  # Windows: no flock(2)
    fcntl = None

from strategykit.callbacks.backup_integrity import PRIVATE_FILE

LOCK_FILE = ".lock"
# As the launcher's private files (`launcher.private_files`), without O_EXCL: a lock file
# is opened again by each run.
_FLAGS = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
_held: dict[str, int] = {}  # real path of a backup_dir -> the descriptor locking it here


def _drop_inherited() -> None:
    """In a process forked during `fit()` (a data loader's workers, say): closes its copies
    of the lock's descriptors, which would otherwise keep the lock after its parent
    released it. The parent's own descriptors hold it on."""
    while _held:
        os.close(_held.popitem()[1])


os.register_at_fork(after_in_child=_drop_inherited)


def acquire(backup_dir: str) -> None:
    """Locks `backup_dir` for this process (it must exist); again: nothing to do.

    Raises:
        RuntimeError: another process holds the lock, named with its host, pid and start.
    """
    key = os.path.realpath(backup_dir)
    if key in _held:
        return
    path = os.path.join(backup_dir, LOCK_FILE)
    try:
        descriptor = os.open(path, _FLAGS, PRIVATE_FILE)
    except OSError as error:  # a symbolic link (ELOOP), a folder, no permission
        raise RuntimeError(
            f"BackupAndRestore cannot open its lock file {path} ({error.strerror}); it "
            "never follows a symbolic link there. Received: "
            f"backup_dir={backup_dir!r}. Delete {path} (strategykit makes it anew), or "
            "give this run a backup_dir of its own.") from None
    try:
        if fcntl is not None:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
        holder = _holder(descriptor)
        os.close(descriptor)
        if error.errno in (errno.EWOULDBLOCK, errno.EACCES):
            raise RuntimeError(
                f"backup_dir is in use by another training run ({holder}). Two runs "
                "writing one backup_dir replace each other's backups, and a resume could "
                "load the other run's weights. Received: "
                f"backup_dir={backup_dir!r}. Wait for that run to end (a killed run frees "
                "it at once; a process whose fit() stopped by an exception, such as an "
                "interrupted notebook cell, holds it until it ends or fits again), or give "
                "this run a backup_dir of its own.") from None
        warnings.warn(
            f"BackupAndRestore cannot lock {path} ({error.strerror}: the file system "
            "offers no locks), so it cannot tell whether another run writes the same "
            "backup_dir. Make sure none does.", stacklevel=3)
        return
    os.ftruncate(descriptor, 0)
    os.write(descriptor, json.dumps({"host": socket.gethostname(), "pid": os.getpid(),
                                     "since": time.strftime("%Y-%m-%d %H:%M:%S")}).encode())
    _held[key] = descriptor


def release(backup_dir: str) -> None:
    """Unlocks `backup_dir` if this process holds it (`acquire`)."""
    descriptor = _held.pop(os.path.realpath(backup_dir), None)
    if descriptor is not None:
        os.close(descriptor)  # closing the last descriptor releases a flock


def _holder(descriptor: int) -> str:
    """Who holds the lock, as the lock file says: "pid 12 on host a, since ..."."""
    try:
        holder = json.loads(os.pread(descriptor, 4096, 0).decode())
        return f"pid {holder['pid']} on host {holder['host']}, since {holder['since']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "its process wrote no name yet"
