"""Hooks in a model's train and test steps that record each replica's loss on its device.

Keras runs `model.train_step` once per replica inside `strategy.run` and reduces what it
returns to one mean, so each replica's own loss never leaves the step. `StepHooks`
builds hooked step functions with Keras's public `make_train_function(force=True)`,
over the model's `train_step`/`test_step` wrapped for that moment, and swaps them in for
the model's own `train_function`/`test_function` during `fit()`/`evaluate()`; while
they are in, `compute_loss` is wrapped on the instance too (custom steps that call
`self.compute_loss` work). The user's class and code are untouched, and `uninstall`
puts the model's own functions back, already traced: nothing is traced again.

Inside the step each replica adds the sum of its real examples' weighted losses and
their number (padded copies carry weight -0.0, see `strategykit.batches.marks`:
Keras's own `loss` counts the same) into its own slot of an
on-read-synchronized accumulator (so every step counts, also with
`steps_per_execution > 1`). The step then returns its local copy of the accumulator,
times the number of replicas, as one more output: each replica's copy is zero outside
its own slot, so Keras's "mean" reduction of the outputs turns them into the sums of
all replicas. No collective is added, and the host reads nothing extra: the hooked
function takes that output out of the logs before Keras sees them.

`StepHooks.of(model)` keeps one `StepHooks` per model, with its traced functions,
accumulators and weight snapshot (see `model_cache`): calling `fit()` again, with the
same callback or a new one, traces nothing again.
"""

from __future__ import annotations

import dataclasses
import inspect
import threading

import keras
import numpy as np
import tensorflow as tf

from strategykit.batches import current_step
from strategykit.callbacks import model_cache
from strategykit.callbacks.nan_guard import WeightSnapshot
from strategykit.upstream import reported_losses

_ORIGINAL = "_strategykit_original"
_OUTPUT = "strategykit/replica_sums"
_capture = threading.local()  # MirroredStrategy traces each replica in its own thread
MAX_LOSSES = 8


class ReplicaAccumulator:
    """Per-replica running sums of each loss a step reports, since `reset()`.

    Slot 0 holds the model's loss (`loss x examples` and real examples); the other
    slots the losses a step reports through a `Mean` metric under their own
    names (`value x weight` and weights), in the order the step's trace meets them.

    Args:
        strategy: the model's distribution strategy.
        slots: the most losses a step can report. Default 8.
    """

    def __init__(self, strategy: tf.distribute.Strategy, slots: int = MAX_LOSSES):
        self.replicas = strategy.num_replicas_in_sync
        self.names = ["loss"]  # the name of each slot, filled while tracing
        self.reported: set[str] = set()  # the names the traced steps report
        with strategy.scope():
            self.variable = tf.Variable(
                tf.zeros((slots, 2, self.replicas), tf.float64),
                trainable=False,
                synchronization=tf.VariableSynchronization.ON_READ,
                aggregation=tf.VariableAggregation.SUM,
            )
        self._local = strategy.experimental_local_results(self.variable)
        self.latest = None  # the step output holding every replica's sums

    def slot(self, name: str) -> int:
        """The slot of the loss `name`, given a new one the first time (while tracing)."""
        if name not in self.names:
            if len(self.names) == self.variable.shape[0]:
                raise ValueError(
                    f"CrossReplicaLoss records at most {self.variable.shape[0]} losses a "
                    f"step. Received: a step that reports {self.names + [name]}. Report "
                    f"at most {self.variable.shape[0]} losses through keras.metrics.Mean "
                    "trackers (add the others up into one)."
                )
            self.names.append(name)
        self.reported.add(name)
        return self.names.index(name)

    def reported_names(self) -> list[str]:
        """The names of the losses the traced steps report, in slot order."""
        return [name for name in self.names if name in self.reported]

    def add(self, sums: dict):
        """Adds this replica's `{slot: (sum, count)}`; returns the output to send out of
        the step. Call in replica context."""
        replica = tf.distribute.get_replica_context().replica_id_in_sync_group
        # MirroredStrategy's replica id is a constant made outside the step's graph; used
        # as a tensor it breaks inside steps_per_execution's while loop. Prefer its value.
        static = tf.get_static_value(replica)
        replica = static if static is not None else tf.cast(replica, tf.int32)
        mine = tf.equal(tf.range(self.replicas), replica)
        zeros = tf.zeros([self.replicas], tf.float64)  # not one_hot * value: 0 * NaN is NaN
        slots = sorted(sums)
        rows = tf.stack([tf.stack([tf.where(mine, sums[slot][0], zeros),
                                   tf.where(mine, sums[slot][1], zeros)]) for slot in slots])
        updated = self.variable.assign_add(  # the slots in use only
            tf.scatter_nd([[slot] for slot in slots], rows, self.variable.shape))
        # Shape [1, slots, 2, replicas]: Keras averages it element-wise over every replica.
        return tf.expand_dims(tf.convert_to_tensor(updated) * self.replicas, 0)

    def reset(self) -> None:
        """Zeroes every replica's sums."""
        # Each local copy directly: an on-read variable's cross-replica assign is ~50x slower.
        for copy in self._local:
            copy.assign(tf.zeros_like(copy))
        self.latest = None

    def read(self, name: str = "loss") -> tuple[np.ndarray, np.ndarray]:
        """`(mean value, real examples or weights)` of each replica for the loss `name`
        since the last reset."""
        if self.latest is None or name not in self.names:
            return np.full(self.replicas, np.nan), np.zeros(self.replicas)
        sums = np.asarray(self.latest, np.float64).reshape(-1, 2, self.replicas)
        totals, counts = sums[self.names.index(name)]
        with np.errstate(invalid="ignore", divide="ignore"):
            return totals / counts, counts


@dataclasses.dataclass(frozen=True)
class _Swap:
    """A model's own step function and the hooked one built over it."""

    own: object
    hooked: object


class StepHooks:
    """Hooked step functions of one model, which put every replica's loss in accumulators.

    Build it with `StepHooks.of(model)`, which reuses the model's hooks while its
    variables stay the same.

    Args:
        model: a compiled Keras model.

    Attributes:
        train, test: the `ReplicaAccumulator` of the train and the test steps.
        snapshot: the `WeightSnapshot` taken before every train step, once a
            `install(train=True, snapshot=True)` has needed it; else None.
    """

    def __init__(self, model: keras.Model):
        self.model = model
        strategy = model.distribute_strategy
        self.train = ReplicaAccumulator(strategy)
        self.test = ReplicaAccumulator(strategy)
        self.snapshot: WeightSnapshot | None = None
        self._swaps: dict[tuple[str, bool], _Swap] = {}

    @classmethod
    def of(cls, model: keras.Model) -> StepHooks:
        """The hooks of `model`: built on first use, rebuilt when its variables change."""
        return model_cache.cached(model, "step_hooks", variables=snapshot_variables(model),
                                  build=lambda: cls(model))

    def install(self, *, train: bool, snapshot: bool = False) -> None:
        """Swaps in the hooked test function, and the hooked train function when `train`.

        Args:
            train: hook the train step too (in `fit()`), not only the test step.
            snapshot: with `train`, copy the weights and optimizer variables into
                `self.snapshot` at the start of every train step.
        """
        _unwrap(self.model, "compute_loss")  # left by a fit() that was interrupted
        _wrap(self.model, "compute_loss", _capturing_compute_loss(self.model.compute_loss))
        self._swap_in("test", snapshot=False)
        if train:
            if snapshot and self.snapshot is None:
                self.snapshot = WeightSnapshot(snapshot_variables(self.model),
                                               self.model.distribute_strategy)
            self._swap_in("train", snapshot=snapshot)

    def uninstall(self) -> None:
        """Puts the model's own step functions and `compute_loss` back."""
        _unwrap(self.model, "compute_loss")
        for (kind, _), swap in self._swaps.items():
            if getattr(self.model, f"{kind}_function") is swap.hooked:
                setattr(self.model, f"{kind}_function", swap.own)

    def _swap_in(self, kind: str, *, snapshot: bool) -> None:
        current = getattr(self.model, f"{kind}_function")
        if current is None:  # e.g. the test function before fit()'s first validation
            getattr(self.model, f"make_{kind}_function")()
            current = getattr(self.model, f"{kind}_function")
        swap = self._swaps.get((kind, snapshot))
        # The model's function is new after compile(): hook the new one.
        if swap is None or (current is not swap.own and current is not swap.hooked):
            swap = self._swaps[(kind, snapshot)] = _Swap(current, self._build(kind, snapshot))
        setattr(self.model, f"{kind}_function", swap.hooked)

    def _build(self, kind: str, snapshot: bool):
        """A new step function over the model's step wrapped by `_hooked_step`."""
        accumulator = self.train if kind == "train" else self.test
        before = (self.snapshot.take,) if snapshot else ()
        name = f"{kind}_step"
        # `make_*_function` binds the step it finds on the model; only that needs the wrap.
        _wrap(self.model, name, _hooked_step(getattr(self.model, name), accumulator, before))
        try:
            getattr(self.model, f"make_{kind}_function")(force=True)
        finally:
            _unwrap(self.model, name)
        return _taking_sums(getattr(self.model, f"{kind}_function"), accumulator)


def snapshot_variables(model: keras.Model) -> list:
    """The variables a step changes: the model's weights and its optimizer's variables."""
    optimizer = getattr(model, "optimizer", None)
    return list(model.weights) + (list(optimizer.variables) if optimizer is not None else [])


def _wrap(model, name, wrapper) -> None:
    setattr(wrapper, _ORIGINAL, model.__dict__.get(name))  # None: the class's method
    object.__setattr__(model, name, wrapper)


def _unwrap(model, name) -> bool:
    wrapper = model.__dict__.get(name)
    if wrapper is None or not hasattr(wrapper, _ORIGINAL):
        return False
    original = getattr(wrapper, _ORIGINAL)
    if original is None:
        object.__delattr__(model, name)
    else:
        object.__setattr__(model, name, original)
    return True


def _hooked_step(step, accumulator, before):
    """`step` that also adds this replica's losses to `accumulator`, after `before` hooks:
    those it reports through a `Mean` metric, else `compute_loss`'s."""

    def hooked_step(data):
        for hook in before:
            hook()
        previous, _capture.losses = getattr(_capture, "losses", None), []
        reported = {}
        try:
            with reported_losses.observe(
                    lambda name, value, weight: _add(reported, name, value, weight)):
                logs = step(data)
            losses = _capture.losses
        finally:
            _capture.losses = previous
        if not losses and not reported:
            raise ValueError(
                "CrossReplicaLoss could not see the loss of the step: the model's "
                f"{step.__name__} never called self.compute_loss(...) nor added a loss "
                "to a keras.metrics.Mean. Received: a "
                f"{step.__name__} that computes its loss another way. Compute the "
                "loss with self.compute_loss(x, y, y_pred, sample_weight) or a "
                "keras.losses.Loss, and report it with a keras.metrics.Mean tracker."
            )
        if losses and "loss" not in reported:
            reported["loss"] = losses[-1]
        sums = {accumulator.slot(name): value for name, value in reported.items()}
        return {**logs, _OUTPUT: accumulator.add(sums)}

    return hooked_step


def _add(reported: dict, name: str, value, weight) -> None:
    """Adds a loss a metric `name` reported, `(value x weight, weight)`, to `reported`."""
    value = tf.cast(value, tf.float64)
    weight = tf.ones_like(value) * (1.0 if weight is None else tf.cast(weight, tf.float64))
    total, count = reported.get(name, (0.0, 0.0))
    reported[name] = (total + tf.reduce_sum(value * weight), count + tf.reduce_sum(weight))


def _taking_sums(function, accumulator):
    """Wraps a Keras step function: takes our output out of its logs into `accumulator`."""

    def step_function(iterator):
        logs = function(iterator)
        accumulator.latest = logs.pop(_OUTPUT)
        return logs

    return step_function


def _capturing_compute_loss(compute_loss):
    signature = inspect.signature(compute_loss)

    def capturing_compute_loss(*args, **kwargs):
        loss = compute_loss(*args, **kwargs)
        losses = getattr(_capture, "losses", None)
        if losses is not None and loss is not None:
            arguments = signature.bind_partial(*args, **kwargs).arguments
            losses.append(_loss_statistics(loss, arguments))
        return loss

    return capturing_compute_loss


def _loss_statistics(loss, arguments):
    """`(loss x batch size, real examples)` of this replica's batch, as float64."""
    outputs = arguments.get("y_pred")
    if outputs is None:
        outputs = arguments.get("x")
    flat = [t for t in tf.nest.flatten(outputs) if t is not None]
    batch = tf.cast(tf.shape(flat[0])[0], tf.float64) if flat else tf.constant(1.0, tf.float64)
    # Keras scales the loss by 1 / replicas inside a replica (so that summed gradients
    # are the global mean) and its loss tracker multiplies it back; so do we.
    replicas = tf.distribute.get_strategy().num_replicas_in_sync
    loss = tf.cast(loss, tf.float64) * replicas
    sample_weight = arguments.get("sample_weight")
    if not [w for w in tf.nest.flatten(sample_weight) if w is not None]:
        return loss * batch, batch
    # `loss x batch` is the weighted sum of the losses, with the real examples of a
    # padded batch weighed up by `global batch / real examples` (sk.shard): times
    # `fraction` it is the sum one device adds up, over the real examples.
    real, fraction = current_step.counts(sample_weight)
    return (loss * batch * tf.cast(fraction, tf.float64),
            tf.reduce_sum(tf.cast(real, tf.float64)))
