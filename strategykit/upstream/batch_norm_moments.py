"""Keras's batch norm on a padded final batch, and synchronized with a mask.

`keras.layers.BatchNormalization` takes its training moments in `_moments(inputs,
mask)`, and its moving statistics from them. Two gaps (keras-team/keras, unreported):

* The padded copies of `sk.shard`'s final partial batch (sample weight -0.0, see
  `strategykit.batches.marks`) enter the moments and the moving statistics, which one
  device, training on the real examples alone, never sees: 1% off a conv kernel after
  two epochs of 197 examples in batches of 64.
* With `synchronized=True` and a mask (a masked sequence), Keras takes the masked
  moments of each replica's own batch: not synchronized at all.

Under a strategy strategykit made or sharded for (`strategykit.made.strategies`; Keras's
own everywhere else) the replacement takes the moments over the real examples of the
step being traced (`strategykit.batches.current_step`, published by every step function
Keras builds for such a model), the layer's mask respected:

* synchronized, several replicas: strategykit's one-all-reduce moments over every
  replica's real examples (`strategykit.batches.moments`, as `sk.SyncBatchNormalization`),
  where the step has sample weights or the layer a mask; Keras's own elsewhere.
* one replica (or none): over the real examples where the batch holds a padded copy
  (a `tf.cond`: a batch without copies gets Keras's own moments, bit for bit).
* not synchronized, several replicas: Keras's own, each replica's batch, copies
  included: such a layer differs from one device on every batch anyway (`sk.check`
  names it), and a replica whose examples are all copies would have no moments.
"""

from __future__ import annotations

import tensorflow as tf

from strategykit.batches import current_step
from strategykit.batches.moments import cross_replica_moments, over_real_examples
from strategykit.made import strategies
from strategykit.pinning.fix import Fix, original, resolve

ISSUE = "keras-team/keras (unreported)"
_BATCH_NORM = "keras.src.layers.normalization.batch_normalization:BatchNormalization"


def moments_over_real_examples(self, inputs, mask):
    """Keras's `_moments`, over the real examples of the step (see the module docstring)."""
    own = original(resolve(_BATCH_NORM), "_moments")
    if not strategies.in_ours():
        return own(self, inputs, mask)
    context = tf.distribute.get_replica_context()
    replicas = 1 if context is None else context.num_replicas_in_sync
    step = current_step.current()
    real = None if step is None else step.real
    if replicas > 1 and not (self.synchronized and (real is not None or mask is not None)):
        return own(self, inputs, mask)
    if replicas == 1 and real is None:
        return own(self, inputs, mask)
    channel_axis = self.axis % len(inputs.shape)
    layer_mask = None if mask is None else tf.expand_dims(tf.cast(mask, tf.bool), channel_axis)
    full_mask = over_real_examples(inputs, layer_mask)
    axes = list(self._reduction_axes)

    def masked():
        return cross_replica_moments(inputs, axes, full_mask, context)

    if replicas > 1:
        return masked()
    if full_mask is layer_mask:  # not batch-major: no example to leave out
        return own(self, inputs, mask)
    return tf.cond(tf.reduce_all(real), lambda: own(self, inputs, mask), masked)


def _padded_batch_on_several_replicas(self, inputs, mask) -> bool:
    """Where Keras's own moments differ from one device's: a synchronized layer of a
    step with sample weights (which may hold padded copies) or a mask."""
    context = tf.distribute.get_replica_context()
    step = current_step.current()
    return (strategies.in_ours() and context is not None
            and context.num_replicas_in_sync > 1 and self.synchronized
            and (mask is not None or (step is not None and step.real is not None)))


FIXES = (
    Fix(
        issue=ISSUE,
        affects="synchronized batch norm on the padded final batch of sk.shard",
        owner=_BATCH_NORM,
        attribute="_moments",
        replacement=moments_over_real_examples,
        refuses_when=_padded_batch_on_several_replicas,
        relies_on={  # 3.8.0 to 3.13.2, 3.14.0 to 3.15.1 (renorm); _moments: 3.8.0,
            # 3.9.0 to 3.14.1, 3.15.0 to 3.15.1; build: 3.8 to 3.9, 3.10 to 3.13, 3.14 on
            # `call` in training: `mean, variance = self._moments(inputs, mask)`, then
            # the moving statistics from them; mask of the inputs' rank minus one
            f"{_BATCH_NORM}.call": ("9b6a3cfad619b3f6", "31502bd832c5eb64"),
            # replaced, called where Keras's own is right; reads `_reduction_axes`
            f"{_BATCH_NORM}._moments": (
                "08ec7edbbc47aaea", "e168ab1449ab50ae", "2ba739b46f4fadea"),
            f"{_BATCH_NORM}.build": (
                "774aac082a328f8f", "175b9ca566e84d38", "d615e5ddb968b5d5"),
        },
    ),
)
