"""Deleting dataset iterators on a thread of their own, so no user's call waits on one.

TensorFlow 2.21 deletes an iterator's tf.data resources only when its threads wake by
themselves (those seen waiting are tf.data's autotuning threads, whose period doubles up
to 60 s), so the thread that drops the last reference to an iterator waits: 0.2 to 100 s
for a distributed one (`benchmarks/iterator_release.py`). Dropped inside `fit()`, that is
`fit()` returning late; dropped by Python's garbage collector, it is a notebook freezing
at some later line.

`release(iterator)` hands an iterator to a daemon thread instead (the process's one
`IteratorReaper`; a test makes one of its own). The thread waits until
it holds the last reference (Keras's loop may still name the iterator until its next
epoch), then drops it there, so the wait falls on that thread alone. Nothing changes in
what the iterator gave.

The wait is in dropping that last reference: measured for a distributed iterator and
an `sk.shard` one (4 replicas, idle 15 s), dropping it blocked 4.6 s and 25.9 s, and
the garbage collection after it (the traced functions of its multi-device iterator,
which form reference cycles) took 0.4 s without waiting on anything. So the thread does
not collect garbage: a full collection costs CPU in proportion to everything the
process holds (0.8 s a release in a test process with a few dozen trained models; a
notebook's is no smaller), which the user's thread would wait for behind the GIL at
every epoch. Those cycles go with the process's next ordinary collection.

The thread deletes one object at a time. At exit it is stopped after the deletion in
progress (`atexit`): a daemon thread that comes back from TensorFlow once Python has
begun to finalize is ended by the interpreter from inside TensorFlow's C++ code, which
aborts the process ("FATAL: exception not rethrown", exit code 134). The objects it
still holds are then left to the operating system, which frees a process's memory at
once: deleted while the interpreter finalizes, each would make the exit wait as long
as a deletion does (a test process was seen to take minutes to exit).

An object released twice (Keras's loop and a caller can both release one iterator) is
held once: held twice, its references would never come down to the reaper's alone.
"""

from __future__ import annotations

import atexit
import ctypes
import sys
import threading
import time
import weakref

_POLL_SECONDS = 0.2


class IteratorReaper:
    """A daemon thread that deletes the objects released to it once only it holds them.

    Example:
        >>> import tensorflow as tf
        >>> reaper = IteratorReaper(name="example-reaper")
        >>> reaper.release(iter(tf.data.Dataset.range(3)))
        >>> reaper.wait_until_idle(timeout=10)
        True
    """

    def __init__(self, name: str = "strategykit-iterator-reaper"):
        self.name = name
        self._held: dict = {}  # id -> object: an object released twice is held once
        # Re-entrant: a garbage collection inside a locked section (any allocation can
        # start one) may run a finalizer that releases an iterator on the same thread.
        self._lock = threading.RLock()
        self._wake = threading.Event()
        self._thread = None
        self._deleting = 0  # taken off the list and being deleted
        self._stopping = threading.Event()  # set at exit
        _REAPERS.add(self)

    def release(self, iterator) -> None:
        """Deletes `iterator` on this reaper's thread once nothing else refers to it.

        Args:
            iterator: a dataset iterator (or any object) the caller is done with; the
                caller should drop its own references to it.
        """
        with self._lock:
            self._held[id(iterator)] = iterator
            if ((self._thread is None or not self._thread.is_alive())
                    and not self._stopping.is_set()):
                self._thread = threading.Thread(target=self._reap, name=self.name,
                                                daemon=True)
                self._thread.start()
        self._wake.set()

    def pending(self) -> int:
        """How many released iterators are not deleted yet."""
        with self._lock:
            return len(self._held) + self._deleting

    def wait_until_idle(self, timeout: float) -> bool:
        """Waits until every released iterator is deleted; True if so within `timeout` s."""
        deadline = time.monotonic() + timeout
        while self.pending():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    def stop(self) -> None:
        """Stops the thread after the deletion in progress (see the module docstring)."""
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()

    def _reap(self) -> None:
        while not self._stopping.is_set():
            self._wake.wait(_POLL_SECONDS)
            self._wake.clear()
            while not self._stopping.is_set() and self._delete_one():
                pass

    def _delete_one(self) -> bool:
        """Deletes one object that only this reaper holds; False if there is none."""
        with self._lock:
            # Held by the dict alone: its reference and getrefcount's argument. The keys
            # are copied: a finalizer run by an allocation here may release one more.
            key = next((key for key in list(self._held)
                        if sys.getrefcount(self._held[key]) <= 2), None)
            if key is None:
                return False
            doomed = self._held.pop(key)
            self._deleting = 1
        del doomed  # the deletion that may wait, outside the lock
        with self._lock:
            self._deleting = 0
        return True

    def _leave_to_the_os(self) -> None:
        """Makes the objects still held outlive the interpreter (see the module docstring)."""
        with self._lock:
            for held in self._held.values():
                ctypes.pythonapi.Py_IncRef(ctypes.py_object(held))


_REAPERS: weakref.WeakSet[IteratorReaper] = weakref.WeakSet()
_PROCESS_REAPER = IteratorReaper()


def release(iterator) -> None:
    """Deletes `iterator` on the process's reaper thread once nothing else refers to it.

    Args:
        iterator: a dataset iterator (or any object) the caller is done with; the caller
            should drop its own references to it.

    Example:
        >>> import tensorflow as tf
        >>> release(iter(tf.data.Dataset.range(3)))
        >>> wait_until_idle(timeout=10)
        True
    """
    _PROCESS_REAPER.release(iterator)


def pending() -> int:
    """How many iterators released to the process's reaper are not deleted yet."""
    return _PROCESS_REAPER.pending()


def wait_until_idle(timeout: float) -> bool:
    """Waits until the process's reaper has deleted all it was given; True if so in time."""
    return _PROCESS_REAPER.wait_until_idle(timeout)


@atexit.register
def _stop_all() -> None:
    for reaper in list(_REAPERS):
        reaper.stop()
        reaper._leave_to_the_os()
