"""What the progress bar shows of `CrossReplicaLoss`'s keys: `progress=` and its display.

Keras draws the progress bar with the `keras.callbacks.ProgbarLogger` it adds to every
`fit()`, `evaluate()` and `predict()`, after the user's callbacks, and it shows every
key of the logs: with 4 replicas `CrossReplicaLoss` adds 9, with 8 replicas 13, and
the line no longer fits a terminal. Keras adds no `ProgbarLogger` when the callback list
already holds one, so `CrossReplicaLoss` is one (see there) and draws the bar itself
through `ProgressDisplay`: a real `ProgbarLogger` fed a copy of the logs without the
keys `progress` hides. The logs themselves keep every key, for `History`, `CSVLogger`,
`TensorBoard` and `LossPlot`.

Keras's own bar runs after every other callback and so shows the keys they add (such
as `ReduceLROnPlateau`'s `learning_rate`). `CrossReplicaLoss` is listed first, so the
display keeps each update until the next event of the loop, when every callback has
seen it: the bar shows the same keys, in the same order on screen, as Keras's own.
"""

from __future__ import annotations

import re

import keras

PROGRESS_CHOICES = ("auto", "all", "spread", "none")
"""The valid string values of `progress`."""

SPREAD = ("loss/min", "loss/max")
"""The keys `progress="spread"` shows: the lowest and highest replica loss."""

_OWN_KEY = re.compile(r"^(?:val_)?(loss/\w+|replica_drift)$")


def check_progress(progress) -> None:
    """Raises ValueError for a `progress` that is neither a choice nor a list of keys."""
    if isinstance(progress, str):
        valid = progress in PROGRESS_CHOICES
    else:
        try:
            valid = all(isinstance(key, str) for key in progress)
        except TypeError:
            valid = False
    if not valid:
        raise ValueError(
            f"progress must be one of {', '.join(repr(c) for c in PROGRESS_CHOICES)} or a "
            f"list of keys. Received: progress={progress!r}. Use e.g. progress='spread' "
            "or progress=('loss/mean', 'loss/max')."
        )


def shown_keys(progress, replicas: int) -> frozenset | None:
    """The keys of `CrossReplicaLoss` the bar shows (without `val_`); None for all.

    Example:
        >>> sorted(shown_keys("auto", replicas=4))
        ['loss/max', 'loss/min']
        >>> shown_keys("auto", replicas=2) is None
        True
    """
    if progress == "auto":
        progress = "spread" if replicas > 2 else "all"
    if progress == "all":
        return None
    if progress == "spread":
        return frozenset(SPREAD)
    if progress == "none":
        return frozenset()
    return frozenset(progress)


class ProgressDisplay:
    """Keras's progress bar, fed the logs without the hidden keys, each update deferred
    to the loop's next event (see the module docstring).

    Args:
        shown: keys of `CrossReplicaLoss` to show, without the `val_` prefix; None
            for every key. Other keys are always shown.
    """

    def __init__(self, shown: frozenset | None = None):
        self.shown = shown
        self.bar = keras.callbacks.ProgbarLogger()
        self._model = None
        self._pending = None  # (hook, positional arguments, the logs dict)

    def set_model(self, model) -> None:
        self._model = model

    def set_params(self, params) -> None:
        """Starts a new bar: Keras calls this once per `fit()`/`evaluate()`/`predict()`,
        and a `ProgbarLogger` is made for one of them (it stays silent in evaluation
        once it has seen a `fit()`)."""
        self._pending = None
        self.bar = keras.callbacks.ProgbarLogger()
        self.bar.set_model(self._model)
        self.bar.set_params(params)

    def now(self, hook: str, *args, logs=None) -> None:
        """Shows what is pending, then runs the bar's `hook` at once."""
        self.flush()
        getattr(self.bar, hook)(*args, self.visible(logs))

    def later(self, hook: str, *args, logs=None) -> None:
        """Shows what is pending, then keeps this update until the next event."""
        self.flush()
        self._pending = (hook, args, logs)

    def flush(self) -> None:
        """Shows the pending update, with the keys the logs hold by now."""
        if self._pending is not None:
            hook, args, logs = self._pending
            self._pending = None
            getattr(self.bar, hook)(*args, self.visible(logs))

    def visible(self, logs):
        """A copy of `logs` without the hidden keys (None stays None)."""
        if logs is None or self.shown is None:
            return None if logs is None else dict(logs)
        return {key: value for key, value in logs.items()
                if not _OWN_KEY.match(key) or key.removeprefix("val_") in self.shown}
