"""Files written once in a job of several workers: the chief writes, the others don't collide.

Every worker of a job runs the same code, so a callback that writes a file writes it on
every worker, into the same path when the workers share a filesystem (one machine, or a
shared disk). `writable_path` gives the chief the path it asked for and every other
worker a path of its own in a scratch directory, which is deleted when the process
ends. The other workers still do the work of writing (a save can read distributed
variables, and every worker must take part in the same steps), but nothing they write
lands where the chief's files are.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

import tensorflow as tf

from strategykit.cluster.roles import is_chief, is_multi_worker, worker_index

_scratch: dict[int, str] = {}  # worker index -> this process's scratch directory


def writable_path(path, strategy: tf.distribute.Strategy | None = None) -> str:
    """Where this worker writes what the user asked to write to `path`.

    Args:
        path: a file or directory path (it may hold format fields such as `{epoch}`).
        strategy: the strategy the job trains under. Default: the current one
            (`tf.distribute.get_strategy()`).

    Returns:
        `path` itself on the chief and whenever training runs on one worker; otherwise
        the same relative path inside this worker's scratch directory.

    Example:
        >>> from strategykit.cluster.chief_files import writable_path
        >>> writable_path("logs/run1")  # one worker: the path itself
        'logs/run1'
    """
    path = os.fspath(path)
    strategy = strategy or tf.distribute.get_strategy()
    if not is_multi_worker(strategy) or is_chief(strategy):
        return path
    scratch = scratch_directory(worker_index(strategy))
    if path.startswith(scratch):
        return path  # already redirected (a callback reused for another fit)
    relative = path.replace("://", "/").lstrip(os.sep).lstrip("/") or "root"
    redirected = os.path.join(scratch, relative)
    os.makedirs(os.path.dirname(redirected), exist_ok=True)  # the chief's may exist
    return redirected


def scratch_directory(worker: int) -> str:
    """This process's scratch directory for worker `worker`, deleted at exit."""
    if worker not in _scratch:
        _scratch[worker] = tempfile.mkdtemp(prefix=f"strategykit-worker{worker}-")
        atexit.register(shutil.rmtree, _scratch[worker], ignore_errors=True)
    return _scratch[worker]
