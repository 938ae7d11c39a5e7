"""Keras's metrics and its `loss` under a strategy: over the real examples, as one device.

tensorflow/tensorflow#39268: under a `tf.distribute` strategy the numbers Keras reports
are not those of one device. `sk.shard` pads the final partial batch to a full global
batch so that every replica computes, and weighs its `r` real examples by
`global_batch_size / r` so that the loss and the gradients are those of one device. Keras
then counts the padded copies in every metric of `compile(metrics=...)`, sees the
scaled weights in every metric of `weighted_metrics=`, and weighs each replica's loss
by its padded batch size in its `loss` tracker. These fixes give Keras's own train and
test steps the batch one device would have seen:

* `Trainer._compute_loss` (Keras's steps call it just before adding the step's loss to
  the `loss` tracker, weighted by the batch size): after the loss, each replica counts
  its real examples and one all-reduce adds up the step's real and padded counts; the
  tracker's `total` and `count` are corrected to `loss x real examples`, as one device
  adds them. The counts are kept for the step's `compute_metrics`.
* `Trainer.compute_metrics`: the compiled metrics are updated with the real examples
  only (`tf.boolean_mask`), and with the weights the user gave (the scaled weights
  times `r / global_batch_size`).

A padded copy carries a sample weight of negative zero (`strategykit.batches.marks`): it
adds nothing to a loss, as zero does, and tells the copies from real examples that the
user weighed 0 (which one device counts in `metrics=`). Full batches (`r` equals the global batch)
are unchanged: the correction adds zero and the mask keeps every example. Outside a
replica context of a strategy strategykit made or sharded for, or without sample
weights, both hand over to Keras unchanged; so do they,
with a warning, for a model compiled with `steps_per_execution` > 1 on several replicas
where Keras runs its own loop of several steps (with `steps_per_epoch`, or data of an
unknown number of steps: TensorFlow cannot all-reduce there). Elsewhere strategykit runs
those steps itself (`steps_per_execution`), and the numbers are exact.

Every replica still updates its own copy of each metric with its own examples, and
Keras adds the copies up when it reads a metric: exact for every metric whose state is
a sum over examples (all of Keras's built-in metrics). State that is not a sum is
combined as `sk.combine_across_replicas` declares (`metric_state`), and a metric of the
user's own that is not declared gets a warning at its first use.
"""

from __future__ import annotations

import warnings
import weakref

import tensorflow as tf

from strategykit.batches import current_step
from strategykit.made import strategies
from strategykit.metrics import metric_state
from strategykit.pinning.fix import Fix, original, resolve
from strategykit.upstream import steps_per_execution

ISSUE = "tensorflow/tensorflow#39268"
_TRAINER = "keras.src.trainers.trainer:Trainer"


def _in_replica_context() -> bool:
    """In a replica step of a strategy of strategykit's: where these fixes apply."""
    return strategies.in_ours() and not tf.distribute.in_cross_replica_context()


_warned_models = weakref.WeakSet()


def _can_communicate(model) -> bool:
    """False where TensorFlow cannot all-reduce inside Keras's step: several steps in one
    call on several replicas (a loop of TensorFlow's, where `merge_call` fails); warns
    once per model that its numbers are then Keras's own."""
    replicas = tf.distribute.get_strategy().num_replicas_in_sync
    steps = getattr(model, "steps_per_execution", 1)
    if replicas == 1 or steps == 1 or steps_per_execution.in_own_loop():
        return True
    if model not in _warned_models:
        _warned_models.add(model)
        warnings.warn(
            f"strategykit: steps_per_execution={steps} under {replicas} replicas, with "
            "steps_per_epoch or data of an unknown number of steps: Keras runs its own loop "
            "of several steps, where TensorFlow cannot all-reduce (Keras's fit() fails there "
            "with synchronized batch norm), so the loss and metrics Keras reports are its "
            "own: on the padded final batch of sk.shard they count the padded copies and "
            "the scaled weights. Leave out steps_per_epoch (strategykit then runs the steps "
            "itself, exactly), or compile with steps_per_execution=1.", stacklevel=2)
    return False


def _applies(model, sample_weight) -> bool:
    return sample_weight is not None and _in_replica_context() and _can_communicate(model)


def _batch_size(x, sample_weight):
    flat = [t for t in tf.nest.flatten(x) if t is not None]
    return tf.shape(flat[0] if flat else tf.nest.flatten(sample_weight)[0])[0]


def compute_loss_over_real_examples(self, x=None, y=None, y_pred=None, sample_weight=None,
                                    training=True):
    """Keras's `_compute_loss`, then the `loss` tracker corrected to the real examples."""
    if not _applies(self, sample_weight):
        return original(_owner(), "_compute_loss")(
            self, x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=training)
    batch = _batch_size(x, sample_weight)
    real, fraction = current_step.counts(sample_weight)  # before: compute_loss may use them
    loss = original(_owner(), "_compute_loss")(
        self, x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=training)
    tracker = getattr(self, "_loss_tracker", None)
    if loss is not None and tracker is not None:
        # Keras adds `loss x batch` (the loss unscaled by the replicas) and `batch`; one
        # device adds the sum of the weighted losses of the real examples and their count.
        replicas = tf.distribute.get_strategy().num_replicas_in_sync
        batch = tf.cast(batch, tracker.dtype)
        weighted_sum = tf.cast(loss, tracker.dtype) * replicas * batch
        tracker.total.assign_add(weighted_sum * (tf.cast(fraction, tracker.dtype) - 1))
        tracker.count.assign_add(tf.reduce_sum(tf.cast(real, tracker.dtype)) - batch)
    return loss


def compute_metrics_over_real_examples(self, x, y, y_pred, sample_weight=None):
    """Keras's `compute_metrics` on the real examples, with the user's weights; metric
    state declared by `sk.combine_across_replicas` combined across the replicas."""
    own = original(_owner(), "compute_metrics")
    compiled = getattr(self, "_compile_metrics", None)
    if (not _in_replica_context() or compiled is None or y is None
            or not _can_communicate(self)):
        return own(self, x, y, y_pred, sample_weight)
    if sample_weight is not None:
        # The counts of this step's _compute_loss, or (a step of its own) new ones.
        real, fraction = current_step.counts(sample_weight)

        def keep(tensor):
            return None if tensor is None else tf.boolean_mask(tensor, real)

        def unscale(weight):
            return None if weight is None else keep(weight) * tf.cast(fraction, weight.dtype)

        y, y_pred = tf.nest.map_structure(keep, y), tf.nest.map_structure(keep, y_pred)
        sample_weight = tf.nest.map_structure(unscale, sample_weight)
    replicas = tf.distribute.get_strategy().num_replicas_in_sync
    if replicas == 1:
        return own(self, x, y, y_pred, sample_weight)
    if not compiled.built:
        compiled.build(y, y_pred)
    metric_state.warn_of_undeclared(compiled.metrics, replicas)
    metric_state.before_update(compiled.metrics, replicas)
    logs = own(self, x, y, y_pred, sample_weight)
    metric_state.after_update(compiled.metrics, replicas)
    return logs


def _owner():
    return resolve(_TRAINER)


def _weighted_on_several_replicas(sample_weight) -> bool:
    """Where the fixes are needed: sample weights (as `sk.shard`'s padded batches carry)
    in a replica context of several replicas."""
    return (sample_weight is not None and _in_replica_context()
            and tf.distribute.get_strategy().num_replicas_in_sync > 1)


def _loss_needs_the_fix(model, x=None, y=None, y_pred=None, sample_weight=None,
                        training=True) -> bool:
    return _weighted_on_several_replicas(sample_weight)


def _metrics_need_the_fix(model, x, y, y_pred, sample_weight=None) -> bool:
    return _weighted_on_several_replicas(sample_weight)


_AFFECTS = "the loss and metrics of a padded final batch (sk.shard) on several replicas"


_RELIES_ON = {
    # Keras's steps: `_compute_loss`, then the tracker gets `unscaled loss`, weighted by
    # the batch size, then `compute_metrics` with the same sample weights.
    # the same on 3.8.0 to 3.11.3, where the tracker's weight is the first input's size
    "keras.src.backend.tensorflow.trainer:TensorFlowTrainer.train_step": (
        "debf0efab9d5794b", "38eff65a3e8e6447"),
    "keras.src.backend.tensorflow.trainer:TensorFlowTrainer.test_step": (
        "a8f04a25512e74e2", "4af0440af44a0942"),
    "keras.src.trainers.trainer:Trainer._compute_loss": "13153b89c765b0d6",
    "keras.src.trainers.trainer:Trainer.compute_metrics": "8c5a423878e01a48",
    # The tracker is a Mean: `total` and `count` added to by `update_state`.
    "keras.src.metrics.reduction_metrics:Mean.update_state": "addc194e254fbb64",
    # Unweighted metrics get no weights, weighted ones the step's.
    # (Keras 3.14.0 flattens y and the weights with tree.flatten: the same here)
    "keras.src.trainers.compile_utils:CompileMetrics.update_state": (
        "75fad85bf74f4a10", "081025eebb6d4bb1"),
    "keras.src.losses.loss:unscale_loss_for_distribution": "3903c7ed7f69c5ac",
}

FIXES = (
    Fix(issue=ISSUE, affects=_AFFECTS, owner=_TRAINER, attribute="_compute_loss",
        replacement=compute_loss_over_real_examples, relies_on=_RELIES_ON,
        refuses_when=_loss_needs_the_fix),
    Fix(issue=ISSUE, affects=_AFFECTS, owner=_TRAINER, attribute="compute_metrics",
        replacement=compute_metrics_over_real_examples, relies_on=_RELIES_ON,
        refuses_when=_metrics_need_the_fix),
)
