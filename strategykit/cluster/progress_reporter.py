"""Each worker's training progress, reported to `strategykit launch` with no code added.

Under `strategykit launch` (its `progress_file.VARIABLE` set), `sk.from_env()` calls
`install()`: a heartbeat thread starts writing this worker's progress file, and every
`fit()`, `evaluate()` and `predict()` gets one more callback, which records each
completed step. Keras has no public place for a callback every fit should get, so
`install` wraps `keras.callbacks.CallbackList.__init__` (public API) to append it; the
callback is `async_safe`, so Keras dispatches the other callbacks as it would without
it. Without the launcher nothing is installed.
"""

from __future__ import annotations

import os

import keras

from strategykit.cluster.progress_file import VARIABLE, ProgressFile

_installed: dict = {}


class ProgressReporter(keras.callbacks.Callback):
    """Records every completed step (and evaluation or prediction batch) in `progress`.

    Args:
        progress: the worker's `ProgressFile`.
    """

    async_safe = True  # it only notes the time: Keras may call it from its thread pool

    def __init__(self, progress: ProgressFile):
        super().__init__()
        self.progress = progress
        self._epoch = 0

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        self.progress.record(epoch=self._epoch + 1, step=batch + 1)

    def on_test_batch_end(self, batch, logs=None):
        self.progress.record()

    def on_predict_batch_end(self, batch, logs=None):
        self.progress.record()


def install() -> None:
    """Reports this worker's progress when `strategykit launch` asks for it; idempotent.

    Example:
        >>> install()  # outside strategykit launch: does nothing
    """
    path = os.environ.get(VARIABLE)
    if not path or path in _installed:
        return
    progress = ProgressFile(path)
    progress.start_heartbeat()
    original = keras.callbacks.CallbackList.__init__

    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        if not any(isinstance(callback, ProgressReporter) for callback in self.callbacks):
            self.callbacks.append(ProgressReporter(progress))

    keras.callbacks.CallbackList.__init__ = __init__
    _installed[path] = progress
