"""A worker's own hang watch, for jobs started without `strategykit launch`: `Watch`.

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
it pauses between calls, so your own code between them is never cut short. The watch is
told of each call and step by `progress_reporter.ProgressReporter`, the callback that
reports to the launcher under it. No Keras or TensorFlow here.
"""

from __future__ import annotations

import os
import sys
import threading
import time

from strategykit.cluster.seconds_variable import read_seconds
from strategykit.launcher.hang_watch import DEFAULT_TIMEOUT
from strategykit.launcher.worker_contract import HANG_TIMEOUT_VARIABLE, HUNG

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
    return read_seconds(os.environ, HANG_TIMEOUT_VARIABLE, DEFAULT_TIMEOUT,
                        off="to turn the watch off")


class Watch:
    """What a worker's calls to `fit()`, `evaluate()` and `predict()` have done lately.

    It is told as a `ProgressFile` is (`enter_call`, `leave_call`, `record`), by the same
    callback, and ends the process when a call makes no progress for `timeout` seconds.

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

    def enter_call(self) -> None:
        """Notes that a `fit()`, `evaluate()` or `predict()` call begins (they may nest)."""
        with self._lock:
            self._calls += 1
            if self._calls == 1:
                self._last = None
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, daemon=True,
                                            name="strategykit-stall-watchdog")
            self._thread.start()

    def leave_call(self) -> None:
        """Notes that the call begun last ended."""
        with self._lock:
            self._calls = max(0, self._calls - 1)

    def record(self, epoch: int | None = None, step: int | None = None) -> None:
        """Notes progress now; `epoch` and `step` (from 1) when a training step ended."""
        with self._lock:
            self._last = time.time()
            if step is not None:
                self._where = f"last step {step} of epoch {epoch}"

    def check(self, now: float) -> str | None:
        """None while the running call makes progress; else the message it exits with."""
        with self._lock:
            if not self.timeout or not self._calls or self._last is None:
                return None
            if now - self._last < self.timeout:
                return None
            where = self._where
        return (f"strategykit: worker {self.worker} made no progress for {self.timeout:g} s "
                f"({where}): this worker or a peer is stuck. Exiting with code {HUNG} so "
                f"that the job can be restarted ({HANG_TIMEOUT_VARIABLE}=seconds to change, 0 "
                "to turn off).")

    def _run(self) -> None:
        while True:
            time.sleep(_CHECK_SECONDS)
            message = self.check(time.time())
            if message is not None:
                print(message, file=sys.stderr, flush=True)
                self._exit(HUNG)
                return
