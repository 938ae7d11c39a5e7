"""A worker's own hang watch, for jobs started without `strategykit launch`.

Under SLURM or Kubernetes nobody watches the job as `strategykit launch` does
(`hang_watch`). A peer that dies or is stopped stops sending heartbeats to TensorFlow's
coordination service, and every other worker's all-reduce fails about 12 s later
("The following tasks are unhealthy (stopped sending heartbeats)"). A peer that is
alive but stuck (a stuck input pipeline, a deadlock, a network partition that spares
the heartbeats) would make every worker wait in its all-reduce forever. So each worker
of a multi-worker `sk.from_env()` job started without the launcher watches itself:
when, inside `fit()`, `evaluate()` or `predict()`, no step or batch has completed for
`STRATEGYKIT_HANG_TIMEOUT` seconds (default 300, 0 turns it off), it says so on stderr
and exits with code 124, so its peers fail within seconds and the scheduler can
restart the job (which `sk.callbacks.BackupAndRestore` resumes). The watch starts with
the first completed step of each call, so start-up and tracing never count, and
it pauses between calls, so your own code between them is never cut short.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time

import keras

from strategykit.launcher.hang_watch import DEFAULT_TIMEOUT, EXIT_CODE

VARIABLE = "STRATEGYKIT_HANG_TIMEOUT"
"""Seconds without progress after which a worker started without the launcher exits."""

_CHECK_SECONDS = 1.0


def timeout_from_env() -> float:
    """`STRATEGYKIT_HANG_TIMEOUT` in seconds; `DEFAULT_TIMEOUT` (300) when unset.

    Raises:
        ValueError: a value that is not a number of seconds >= 0.

    Example:
        >>> import os
        >>> os.environ.pop("STRATEGYKIT_HANG_TIMEOUT", None) and None
        >>> timeout_from_env()
        300.0
    """
    text = os.environ.get(VARIABLE, "")
    if not text.strip():
        return DEFAULT_TIMEOUT
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0:
        raise ValueError(
            f"{VARIABLE} must be a number of seconds >= 0. Received: {VARIABLE}={text!r}. "
            f"Use e.g. {VARIABLE}=600, or 0 to turn the watch off.")
    return seconds


class Watch:
    """What a worker's calls to `fit()`, `evaluate()` and `predict()` have done lately.

    Args:
        timeout: seconds without a completed step, inside a call, that end the process.
        worker: this worker's index, for the message.
        exit: called with the exit code when the watch fires (tests pass their own).
    """

    def __init__(self, timeout: float, worker: int, exit=os._exit):
        self.timeout, self.worker, self._exit = timeout, worker, exit
        self._lock = threading.Lock()
        self._calls = 0  # fit, evaluate and predict calls running (validation nests)
        self._last: float | None = None  # the last completed step of the running calls
        self._where = "no training step yet"
        self._thread: threading.Thread | None = None

    def begin(self) -> None:
        with self._lock:
            self._calls += 1
            if self._calls == 1:
                self._last = None
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, daemon=True,
                                            name="strategykit-stall-watchdog")
            self._thread.start()

    def end(self) -> None:
        with self._lock:
            self._calls = max(0, self._calls - 1)

    def progress(self, where: str | None = None) -> None:
        with self._lock:
            self._last = time.time()
            if where is not None:
                self._where = where

    def check(self, now: float) -> str | None:
        """None while the running call makes progress; else the message it exits with."""
        with self._lock:
            if not self.timeout or not self._calls or self._last is None:
                return None
            if now - self._last < self.timeout:
                return None
            where = self._where
        return (f"strategykit: worker {self.worker} made no progress for {self.timeout:g} s "
                f"({where}): this worker or a peer is stuck. Exiting with code {EXIT_CODE} so "
                f"that the job can be restarted ({VARIABLE}=seconds to change, 0 to turn off).")

    def _run(self) -> None:
        while True:
            time.sleep(_CHECK_SECONDS)
            message = self.check(time.time())
            if message is not None:
                print(message, file=sys.stderr, flush=True)
                self._exit(EXIT_CODE)
                return


class StallReporter(keras.callbacks.Callback):
    """Tells the `Watch` when calls begin and end and each step completes."""

    async_safe = True

    def __init__(self, watch: Watch):
        super().__init__()
        self.watch = watch
        self._epoch = 0

    def on_train_begin(self, logs=None):
        self.watch.begin()

    on_test_begin = on_predict_begin = on_train_begin

    def on_train_end(self, logs=None):
        self.watch.end()

    on_test_end = on_predict_end = on_train_end

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        self.watch.progress(f"last step {batch + 1} of epoch {self._epoch + 1}")

    def on_test_batch_end(self, batch, logs=None):
        self.watch.progress()

    on_predict_batch_end = on_test_batch_end


def reporter(worker: int):
    """The `StallReporter` maker of this process's watch (one watch a process)."""
    if "maker" not in _watch:
        _watch["maker"] = functools.partial(StallReporter, Watch(timeout_from_env(), worker))
    return _watch["maker"]


_watch: dict = {}
