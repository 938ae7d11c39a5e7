"""Activity regularizer terms over the real examples, summed across replicas as one device.

A layer's `activity_regularizer(output)` is added to the loss by Keras's `Layer.__call__`
(from Keras 3.14 divided by the batch size: a mean over the examples; before, a sum), and
Keras's TensorFlow trainer scales every added loss by `1 / replicas`, as it scales the
compiled loss, so that summing the replicas' gradients gives one device's. That makes:

* before Keras 3.14 (a sum over the batch): `1 / replicas` of one device's term, on
  every batch;
* from 3.14: one device's on full batches; on `sk.shard`'s padded final batch the copies
  count, and each replica divides by its padded batch.

`term(regularizer, output, keras_divides)` is what the regularizer returns instead, while a
step is traced (`strategykit.batches.current_step`): the regularizer of the real
examples only, scaled so that Keras's division and `1 / replicas` leave one device's term
on the step's real examples: times `replicas` for a sum, over the step's fraction of real
examples for a mean. Exact for regularizers that add up over examples (Keras's `L1`,
`L2`, `L1L2`).
"""

from __future__ import annotations

import tensorflow as tf

from strategykit.batches import current_step


def term(regularizer, output, keras_divides: bool):
    """`regularizer(output)` rescaled so that Keras adds up one device's term.

    Args:
        regularizer: the layer's activity regularizer (a callable of a tensor).
        output: one output tensor of the layer, batch first.
        keras_divides: whether Keras divides the term by the batch size (Keras 3.14+).

    Returns:
        The term Keras should see from this replica.

    Example:
        >>> import keras, tensorflow as tf
        >>> step = current_step.publishing(lambda data: term(keras.regularizers.L1(1.0),
        ...                                                  data[0], keras_divides=False))
        >>> float(step((tf.constant([[1.0], [-2.0], [4.0]]), tf.zeros([3]),
        ...             tf.constant([1.0, 1.0, -0.0]))))  # the copy (4.0) is left out
        3.0
    """
    step = current_step.current()
    context = tf.distribute.get_replica_context()
    replicas = 1 if context is None else context.num_replicas_in_sync
    real = None if step is None else step.real_of(output)
    if real is None:
        value = regularizer(output)
        return value if keras_divides else value * tf.cast(replicas, value.dtype)
    value = regularizer(tf.boolean_mask(output, real))
    if keras_divides:
        return value / tf.cast(step.fraction(), value.dtype)
    return value * tf.cast(replicas, value.dtype)
