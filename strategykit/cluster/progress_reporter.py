"""Each worker's training progress, reported to `strategykit launch` with no code added.

Under `strategykit launch` (its `progress_file.VARIABLE` set), `sk.from_env()` asks
`reporter()` for this worker's reporter: a heartbeat thread starts writing this worker's
progress file, and every `fit()`, `evaluate()` and `predict()` gets one more callback
(through `strategykit.upstream.every_fit`), which records each completed step. Without
the launcher nothing is added.
"""

from __future__ import annotations

import functools
import os

import keras

from strategykit.launcher.progress_file import VARIABLE, ProgressFile

_makers: dict = {}  # progress file -> ProgressReporter maker


class ProgressReporter(keras.callbacks.Callback):
    """Records every completed step (and evaluation or prediction batch) in `progress`,
    and when each `fit()`, `evaluate()` and `predict()` begins and ends.

    Args:
        progress: the worker's `ProgressFile`.
    """

    async_safe = True  # it only notes the time: Keras may call it from its thread pool

    def __init__(self, progress: ProgressFile):
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

    def on_predict_batch_end(self, batch, logs=None):
        self.progress.record()


def reporter():
    """This worker's `ProgressReporter` maker under `strategykit launch`, else None.

    The first call starts the heartbeat; later calls return the same maker, for
    `strategykit.upstream.every_fit.add_to_every_fit`.

    Example:
        >>> reporter() is None  # outside strategykit launch
        True
    """
    path = os.environ.get(VARIABLE)
    if not path:
        return None
    if path not in _makers:
        progress = ProgressFile(path)
        progress.start_heartbeat()
        _makers[path] = functools.partial(ProgressReporter, progress)
    return _makers[path]
