"""`LatestOnly`: a job run on a thread of its own for the latest value it was given."""

from __future__ import annotations

import threading

_NOTHING = object()


class LatestOnly:
    """Runs `job(value)` off the caller's thread, for the latest value submitted.

    A value submitted while the job runs waits for it; one not started yet when a newer
    one comes is skipped. `wait()` returns when the job of the latest value has run,
    and raises the first error a job raised since the last `wait()`, so nothing fails
    unseen.

    Args:
        job: called with each value that is not skipped.
        name: the thread's name.

    Example:
        >>> written = []
        >>> writer = LatestOnly(written.append, name="example-writer")
        >>> writer.submit(1); writer.submit(2)
        >>> writer.wait()
        >>> written[-1]
        2
    """

    def __init__(self, job, *, name: str):
        self._job, self._name = job, name
        self._lock = threading.Lock()
        self._pending = _NOTHING
        self._thread = None
        self._error = None

    def submit(self, value) -> None:
        """Has `job(value)` run, after the job running now; replaces a value waiting."""
        with self._lock:
            self._pending = value
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()

    def wait(self) -> None:
        """Waits for the job of the latest value; raises the first error since last time."""
        with self._lock:
            thread = self._thread
        if thread is not None:
            thread.join()
        with self._lock:
            error, self._error = self._error, None
        if error is not None:
            raise error

    def _run(self) -> None:
        while True:
            with self._lock:
                value, self._pending = self._pending, _NOTHING
                if value is _NOTHING:
                    self._thread = None
                    return
            try:
                self._job(value)
            except Exception as error:  # raised by wait(), on the caller's thread
                with self._lock:
                    self._error = self._error or error
