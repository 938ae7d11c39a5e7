"""Each worker's training progress, reported with no code added: `ProgressReporter`.

One Keras callback notes when each `fit()`, `evaluate()` and `predict()` begins and ends
and when each step or batch completes, and tells it to where the job is watched:

- under `strategykit launch` (its `STRATEGYKIT_PROGRESS_FILE` set), to this worker's
  progress file (`strategykit.launcher.progress_file`), which a heartbeat thread writes
  for the launcher's hang watch;
- without the launcher, on a worker of several, to the worker's own watch
  (`stall_watchdog.Watch`), which ends a worker that makes no progress.

`sk.from_env()` asks `reporter()` for this worker's callback and adds it to every
`fit()`, `evaluate()` and `predict()` (through `strategykit.upstream.every_fit`). On one
machine without the launcher nothing is added.
"""

from __future__ import annotations

import functools
import os

import keras

from strategykit.cluster.stall_watchdog import Watch, timeout_from_env
from strategykit.launcher.progress_file import ProgressFile
from strategykit.launcher.worker_contract import PROGRESS_FILE_VARIABLE

_WATCH = object()  # the key of the watch's maker
_makers: dict = {}  # a progress file, or _WATCH -> its ProgressReporter maker


class ProgressReporter(keras.callbacks.Callback):
    """Tells `progress` when each `fit()`, `evaluate()` and `predict()` begins and ends,
    and each training step (counted from 1) and evaluation or prediction batch completes.

    Args:
        progress: where the worker's progress goes: its `ProgressFile` under the launcher,
            else its `stall_watchdog.Watch`; anything with `enter_call()`, `leave_call()`
            and `record(epoch=None, step=None)`.
    """

    async_safe = True  # it only notes the time: Keras may call it from its thread pool

    def __init__(self, progress: ProgressFile | Watch):
        super().__init__()
        self.progress = progress
        self._epoch = 0

    def _enter_call(self, logs=None):
        self.progress.enter_call()

    def _leave_call(self, logs=None):
        self.progress.leave_call()

    on_train_begin = on_test_begin = on_predict_begin = _enter_call
    on_train_end = on_test_end = on_predict_end = _leave_call

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        self.progress.record(epoch=self._epoch + 1, step=batch + 1)

    def on_test_batch_end(self, batch, logs=None):
        self.progress.record()

    on_predict_batch_end = on_test_batch_end


def reporter(worker: int | None = None):
    """This worker's `ProgressReporter` maker, or None where nobody watches.

    Under `strategykit launch`: reporting to the launcher; the first call starts the
    heartbeat. Otherwise, for worker `worker` of a job of several: its own `Watch`, with
    `STRATEGYKIT_HANG_TIMEOUT`. Later calls return the same maker, for
    `strategykit.upstream.every_fit.add_to_every_fit`.

    Args:
        worker: this worker's index in a job of several workers; default None: one
            worker alone, which only the launcher watches.

    Raises:
        ValueError: `STRATEGYKIT_HANG_TIMEOUT` is not a number of seconds >= 0, or
            `STRATEGYKIT_PROGRESS_FILE` names a symbolic link, a folder, a file that is
            not a progress report of this user's, or a path whose folder does not exist
            (`strategykit.launcher.progress_file.check_path`).

    Example:
        >>> reporter() is None  # outside strategykit launch
        True
    """
    path = os.environ.get(PROGRESS_FILE_VARIABLE)
    if path:
        if path not in _makers:
            progress = ProgressFile(path)
            progress.start_heartbeat()
            _makers[path] = functools.partial(ProgressReporter, progress)
        return _makers[path]
    if worker is None:
        return None
    if _WATCH not in _makers:  # one watch a process
        _makers[_WATCH] = functools.partial(ProgressReporter, Watch(timeout_from_env(), worker))
    return _makers[_WATCH]
