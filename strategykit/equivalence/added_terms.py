"""The layers whose `add_loss` term Keras counts otherwise on N replicas than on one device.

Keras's TensorFlow trainer scales every term a layer adds to the loss (`add_loss`, an
activity regularizer) by 1/replicas, as it scales the compiled loss, and the replicas'
gradients are summed. A term that is a mean over the batch (or of the weights only) then
adds up to one device's; a term that is a *sum* over the batch to 1/N of it, as
keras.io's `ActivityRegularizationLayer` (`self.add_loss(1e-2 * ops.sum(inputs))`). On
`sk.shard`'s padded final batch a term of the examples also counts the padded copies,
which a layer cannot tell from real examples. strategykit makes activity regularizers
exact (`strategykit.batches.activity`); a term of the user's own it cannot rescale (it
cannot tell a sum from a mean) nor clear of the copies.

`differing_terms` computes each layer's own terms from the same weights on one device
and on each replica, in a step as `fit()` runs it: on the first global batch, then on a
partial final batch as `sk.shard` pads it, and names the layers whose term Keras counts
otherwise.
"""

from __future__ import annotations

import dataclasses

import keras
import numpy as np
import tensorflow as tf

from strategykit.batches import current_step
from strategykit.batches.marks import pad_weights_like
from strategykit.data.batching import spread_indices
from strategykit.upstream import replica_losses

SUM, COPIES, OTHER = "sum", "copies", "other"


@dataclasses.dataclass(frozen=True)
class DifferingTerm:
    """A layer whose added term Keras counts otherwise on N replicas.

    Attributes:
        layer: the layer's name.
        single: its term on one device.
        distributed: what Keras counts on N replicas: the mean of the replicas' terms.
        cause: `SUM` (the replicas' terms add up to one device's: a sum over the
            batch), `COPIES` (it differs on a padded final batch only: the term counts
            the copies) or `OTHER`.
        batch: the examples of the batch it was found on.
    """

    layer: str
    single: float
    distributed: float
    cause: str
    batch: int

    def text(self, replicas: int, global_batch_size: int) -> str:
        """One line: the layer, the numbers, the cause and the fix."""
        numbers = (f"{self.distributed:.6g} counted on {replicas} replicas, "
                   f"{self.single:.6g} on 1 device")
        if self.cause == SUM:
            return (
                f"  layer {self.layer}: its add_loss term is a sum over the batch ({numbers})"
                f": Keras scales each replica's term by 1/{replicas}, as it scales the loss, "
                f"so a sum counts 1/{replicas} of one device's; add a mean over the batch "
                "(ops.mean), or multiply the sum by "
                "tf.distribute.get_strategy().num_replicas_in_sync")
        if self.cause == COPIES:
            return (
                f"  layer {self.layer}: its add_loss term counts the padded copies of the "
                f"final batch ({self.batch} examples filled up to {global_batch_size}; "
                f"{numbers}): a layer cannot tell a copy from an example; add the term as "
                "the layer's activity_regularizer (strategykit counts the real examples "
                "there), or shard with drop_remainder=True")
        return (f"  layer {self.layer}: its add_loss term differs from one device's "
                f"({numbers}): Keras averages the replicas' terms, one device's only for a "
                "mean over the batch or a term of the weights alone")


def differing_terms(single, distributed, strategy, x, global_batch_size: int, weights,
                    tolerance: float) -> list:
    """The layers whose added term differs between the two models, on the first global
    batch of the inputs `x` and on its partial final batch (if any).

    Sets both models' weights to `weights` first (moving statistics included).

    Args:
        single: the one-device model.
        distributed: the same model built in `strategy`'s scope.
        strategy: the N-replica strategy.
        x: the inputs (an array or a nest), at least one global batch.
        global_batch_size: examples per step, a multiple of the replicas.
        weights: the weights both start from (`get_weights()`).
        tolerance: the largest difference accepted, relative above 1.

    Returns:
        `DifferingTerm`s, in the model's layer order, full batch first; empty on Keras
        code not checked, and for a model without `call()` (trained by its
        `train_step` alone).
    """
    if replica_losses.own_terms_by_layer(single) is None or not _has_call(single):
        return []
    examples = len(tf.nest.flatten(x)[0])
    batches = [(0, global_batch_size)]
    if examples % global_batch_size:
        batches.append((examples - examples % global_batch_size, examples))
    found, named = [], set()
    for start, stop in batches:
        batch = tf.nest.map_structure(lambda array, part=slice(start, stop): array[part], x)
        for name, one, per_replica in _terms_both_ways(single, distributed, strategy, batch,
                                                        global_batch_size, weights):
            counted = float(np.mean(per_replica))
            if name in named or _close(counted, one, tolerance):
                continue
            named.add(name)
            cause = (SUM if _close(float(np.sum(per_replica)), one, tolerance)
                     else COPIES if stop - start < global_batch_size else OTHER)
            found.append(DifferingTerm(name, one, counted, cause, stop - start))
    return found


def _has_call(model) -> bool:
    """Whether the model has a forward pass of its own to compute the terms with: a
    model trained by its `train_step` alone (keras.io's VAE, GAN) has no `call()`."""
    return type(model).call is not keras.Model.call


def _close(found: float, expected: float, tolerance: float) -> bool:
    return abs(found - expected) <= tolerance * max(1.0, abs(expected))


def _terms_both_ways(single, distributed, strategy, batch, global_batch_size, weights):
    """`[(layer name, one device's term, [each replica's term])]` on `batch`, the
    replicas' batches laid out (and padded) as `sk.shard` lays them out."""
    single.set_weights(weights)
    distributed.set_weights(weights)
    # a step of inputs alone: `(x,)` (x may itself be a tuple of inputs)
    one = current_step.publishing(lambda data: _summed(single, data[0]))((batch,))
    replicas = strategy.num_replicas_in_sync
    size = len(tf.nest.flatten(batch)[0])
    reads, real = spread_indices(size, global_batch_size, replicas)
    laid_out = tf.nest.map_structure(lambda array: tf.gather(array, reads), batch)
    ones = tf.ones(tf.shape(real), tf.float64)
    marks = tf.where(real, ones, pad_weights_like(ones))
    per = global_batch_size // replicas

    def part(context):
        k = context.replica_id_in_sync_group
        return tf.nest.map_structure(lambda t: t[k * per:(k + 1) * per], (laid_out, marks))

    parts = strategy.experimental_distribute_values_from_function(part)

    def replica(data):  # `(x, None, marks)`: a step whose copies carry -0.0
        return [value for _, value in _summed(distributed, data[0])]

    def run(parts):
        return strategy.run(current_step.publishing(replica),
                            args=((parts[0], None, parts[1]),))

    # As `fit()` runs this model's steps: traced, or eagerly when compiled with
    # `run_eagerly=True`. Tracing the model under `strategy.run` only to call it once cost
    # 9 of the 10 s of CPU of a failed check on a ResNet50 backbone run eagerly.
    results = (run if distributed.run_eagerly else tf.function(run))(parts)
    return [(name, float(value), [float(v) for v in strategy.experimental_local_results(r)])
            for (name, value), r in zip(one, results, strict=True)]


def _summed(model, x):
    """`[(layer name, sum of its own terms)]` after calling `model` on `x` in training."""
    model(x, training=True)
    return [(layer.name, tf.add_n([tf.cast(term, tf.float64) for term in terms])
             if terms else tf.constant(0.0, tf.float64))
            for layer, terms in replica_losses.own_terms_by_layer(model)]
