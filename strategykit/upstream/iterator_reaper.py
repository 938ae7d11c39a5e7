"""Deleting dataset iterators on a thread of their own, so no user's call waits on one.

TensorFlow 2.21 deletes an iterator's tf.data resources only when its threads wake by
themselves (those seen waiting are tf.data's autotuning threads, whose period doubles up
to 60 s), so the thread that drops the last reference to an iterator waits: 0.2 to 100 s
for a distributed one (`benchmarks/iterator_release.py`). Dropped inside `fit()`, that is
`fit()` returning late; dropped by Python's garbage collector, it is a notebook freezing
at some later line.

`release(iterator)` hands an iterator to a daemon thread instead. The thread waits until
it holds the last reference (Keras's loop may still name the iterator until its next
epoch), then drops it and collects the garbage of its reference cycles there, so the
wait falls on that thread alone. Nothing changes in what the iterator gave.

At exit the thread is stopped after the deletion in progress (`atexit`): a daemon thread
that comes back from TensorFlow once Python has begun to finalize is ended by the
interpreter from inside TensorFlow's C++ code, which aborts the process ("FATAL:
exception not rethrown", exit code 134). Iterators still held are then deleted with
the rest of the process, as they were before.
"""

from __future__ import annotations

import atexit
import gc
import sys
import threading
import time

_POLL_SECONDS = 0.2
_held: list = []
_lock = threading.Lock()
_wake = threading.Event()
_thread = None
_deleting = 0  # iterators taken off the list and being deleted
_stopping = threading.Event()  # set at exit


def release(iterator) -> None:
    """Deletes `iterator` on the reaper's thread once nothing else refers to it.

    Args:
        iterator: a dataset iterator (or any object) the caller is done with; the caller
            should drop its own references to it.

    Example:
        >>> import tensorflow as tf
        >>> release(iter(tf.data.Dataset.range(3)))
        >>> wait_until_idle(timeout=10)
        True
    """
    global _thread
    with _lock:
        _held.append(iterator)
        if (_thread is None or not _thread.is_alive()) and not _stopping.is_set():
            _thread = threading.Thread(target=_reap, name="strategykit-iterator-reaper",
                                       daemon=True)
            _thread.start()
    _wake.set()


def pending() -> int:
    """How many released iterators are not deleted yet."""
    with _lock:
        return len(_held) + _deleting


def wait_until_idle(timeout: float) -> bool:
    """Waits until every released iterator is deleted; True if so within `timeout` s."""
    deadline = time.monotonic() + timeout
    while pending():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _reap() -> None:
    global _deleting
    while True:
        _wake.wait(_POLL_SECONDS)
        _wake.clear()
        if _stopping.is_set():
            return
        with _lock:
            # Held by the list alone: its reference and getrefcount's argument.
            free = [i for i in range(len(_held)) if sys.getrefcount(_held[i]) <= 2]
            done = [_held[i] for i in free]
            for i in reversed(free):
                del _held[i]
            _deleting = len(done)
        if done:
            del done[:]  # the deletions that may wait, outside the lock
            gc.collect()
            with _lock:
                _deleting = 0


@atexit.register
def _stop() -> None:
    """Stops the thread after the deletion in progress (see the module docstring)."""
    _stopping.set()
    _wake.set()
    if _thread is not None:
        _thread.join()
