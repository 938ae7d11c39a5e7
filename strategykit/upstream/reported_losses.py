"""A loss that a custom step reports through a `Mean` metric: one device's value.

Under a strategy of N replicas Keras scales a loss by 1/N inside a replica (a
`keras.losses.Loss` object's value, `Model.compute_loss`'s, every added loss), so that
the gradients the optimizer sums over the replicas are those of the global batch.
Keras's own steps multiply the loss back before adding it to their `loss` tracker; a
custom `train_step` written as keras.io's guides write it (`loss =
self.compute_loss(...)` or `loss = self.loss_fn(...)`, then
`self.loss_tracker.update_state(loss)`) adds the scaled value, and reports 1/N of the
loss, under plain `tf.distribute` too (no upstream issue found).

Under a strategy strategykit made or sharded for (`several_replicas_tracing`; Keras's own
everywhere else):

* `scale_loss_for_distribution` and `Trainer.compute_loss` mark the scaled loss they
  return (an attribute on the tensor; the value is unchanged, gradients too);
* `Mean.update_state` multiplies a marked value by N before it adds it: the mean of the
  replicas' values is what one device reports. Any other value (one the user computed
  from the loss, e.g. `loss * replicas`) is added as it is. A `Sum` adds every replica's
  scaled value: their sum is already one device's (the mean of the replicas' losses).

A scaled loss that a step returns as it is (`return {"loss": loss}`) is still 1/N:
report losses through a metric (docs/guides/custom-steps.md). Observers (`observe`)
see every marked loss a metric adds, by the metric's name, with its weight:
`CrossReplicaLoss` records each replica's value of every loss a step reports that way.

Example:
    >>> from strategykit.upstream import reported_losses
    >>> reported_losses.replicas_scaled_by(1.0) is None
    True
"""

from __future__ import annotations

import contextlib
import functools
import threading

import tensorflow as tf

from strategykit.pinning.fix import Fix, original, resolve
from strategykit.upstream.replica_losses import several_replicas_tracing

_LOSS_MODULE = "keras.src.losses.loss"
_TRAINER = "keras.src.trainers.trainer:Trainer"
_METRICS = "keras.src.metrics.reduction_metrics"
_MARK = "_strategykit_scaled_by_replicas"
_observers = threading.local()  # per replica thread: the functions `observe` added


def replicas_scaled_by(value) -> int | None:
    """The number of replicas `value` was scaled by (1/N) for distribution, or None."""
    return getattr(value, _MARK, None)


def _marked(value, replicas: int):
    with contextlib.suppress(AttributeError):  # a value that takes no attribute: unmarked
        setattr(value, _MARK, replicas)
    return value


def _replicas() -> int:
    return tf.distribute.get_strategy().num_replicas_in_sync


@contextlib.contextmanager
def observe(observer):
    """Calls `observer(name, value, weight)` for each marked loss a metric adds, in this
    thread (replica), while the context is open: `value` is one device's (unscaled),
    `weight` the metric's sample weight (None: one)."""
    previous = getattr(_observers, "functions", ())
    _observers.functions = (*previous, observer)
    try:
        yield
    finally:
        _observers.functions = previous


def _scale_loss_for_distribution(value):
    scaled = original(resolve(_LOSS_MODULE), "scale_loss_for_distribution")(value)
    return _marked(scaled, _replicas()) if several_replicas_tracing() else scaled


@functools.wraps(resolve(f"{_TRAINER}.compute_loss"))  # its signature: hooks bind arguments
def _compute_loss(self, *args, **kwargs):
    loss = original(resolve(_TRAINER), "compute_loss")(self, *args, **kwargs)
    if loss is not None and several_replicas_tracing():
        _marked(loss, _replicas())
    return loss


def _unscaled_mean(self, values, sample_weight=None):
    replicas = replicas_scaled_by(values)
    if replicas is not None and several_replicas_tracing():
        values = values * tf.cast(replicas, values.dtype)
        for observer in getattr(_observers, "functions", ()):
            observer(self.name, values, sample_weight)
    return original(resolve(f"{_METRICS}:Mean"), "update_state")(
        self, values, sample_weight=sample_weight)


_ISSUE = "keras-team/keras (unreported)"
_AFFECTS = "losses a custom train_step reports through a metric on several replicas"
_RELIES_ON = {
    f"{_LOSS_MODULE}:scale_loss_for_distribution": "143cd8a5efb6cb17",
    f"{_TRAINER}.compute_loss": "450e48288d4857f0",
    f"{_METRICS}:Mean.update_state": "addc194e254fbb64",
    # Keras's own steps add the loss multiplied back (a new, unmarked tensor).
    "keras.src.backend.tensorflow.trainer:TensorFlowTrainer.train_step": (
        "38eff65a3e8e6447", "debf0efab9d5794b"),
    "keras.src.backend.tensorflow.trainer:TensorFlowTrainer.test_step": (
        "4af0440af44a0942", "a8f04a25512e74e2"),
}


FIXES = (
    Fix(issue=_ISSUE, affects=_AFFECTS, owner=_LOSS_MODULE,
        attribute="scale_loss_for_distribution", replacement=_scale_loss_for_distribution,
        relies_on=_RELIES_ON),
    Fix(issue=_ISSUE, affects=_AFFECTS, owner=_TRAINER, attribute="compute_loss",
        replacement=_compute_loss, relies_on=_RELIES_ON),
    Fix(issue=_ISSUE, affects=_AFFECTS, owner=f"{_METRICS}:Mean", attribute="update_state",
        replacement=_unscaled_mean, relies_on=_RELIES_ON),
)
