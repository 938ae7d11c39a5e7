"""`EpochTimer`: the wall time of every epoch of `fit()`, for the demo and the benchmarks."""

from __future__ import annotations

import time

import keras


class EpochTimer(keras.callbacks.Callback):
    """Records the wall time of each epoch, in seconds, in `seconds`, and its training
    steps (batch callbacks) in `steps`.

    The first epoch includes tracing the train function; later epochs are the steady
    state. On a noisy machine take the fastest later epoch: interference only adds time.

    Example:
        >>> import keras, numpy as np
        >>> from strategykit.cli.timing import EpochTimer
        >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        >>> model.compile("sgd", "mse")
        >>> timer = EpochTimer()
        >>> _ = model.fit(np.ones((8, 2)), np.ones(8), epochs=2, verbose=0, callbacks=[timer])
        >>> len(timer.seconds), timer.steps
        (2, [1, 1])
    """

    def __init__(self):
        super().__init__()
        self.seconds: list[float] = []
        self.steps: list[int] = []
        self._start = 0.0

    def on_epoch_begin(self, epoch, logs=None):
        self._start = time.perf_counter()
        self.steps.append(0)

    def on_train_batch_end(self, batch, logs=None):
        self.steps[-1] += 1

    def on_epoch_end(self, epoch, logs=None):
        self.seconds.append(time.perf_counter() - self._start)

    @property
    def steady_seconds(self) -> list[float]:
        """The epochs after the first (which traces); the first alone if there is one."""
        return self.seconds[1:] or self.seconds
