"""How a padded copy is marked: the sample weight negative zero (`PAD_WEIGHT`).

A padded copy (`sk.shard`'s final partial batch, filled up to the global batch) adds
nothing to a loss, as a weight of zero does, and the sign bit tells it from a real
example the user weighed 0, which one device counts in its metrics and statistics.
"""

from __future__ import annotations

import tensorflow as tf

PAD_WEIGHT = -0.0
"""The sample weight of a padded copy: negative zero."""


def pad_weights_like(weight: tf.Tensor) -> tf.Tensor:
    """Weights of padded copies shaped as `weight`: all `PAD_WEIGHT`.

    Example:
        >>> import tensorflow as tf
        >>> _ = tf.constant(0.0)  # a cached +0.0 does not take its place
        >>> str(pad_weights_like(tf.ones([2])).numpy().tolist())
        '[-0.0, -0.0]'
    """
    # Negated zeros, not tf.constant(-0.0): eager TensorFlow caches scalar constants by
    # value, and -0.0 == 0.0, so after a tf.constant(0.0) it would hand back +0.0.
    return tf.negative(tf.zeros(tf.shape(weight), weight.dtype))


def real_examples(sample_weight) -> tf.Tensor:
    """A bool per example of the batch: False for a padded copy (weight `PAD_WEIGHT`).

    Example:
        >>> import tensorflow as tf
        >>> real_examples(tf.constant([2.0, 0.0, -0.0])).numpy().tolist()
        [True, True, False]
    """
    weight = tf.nest.flatten(sample_weight)[0]
    per_example = tf.cast(tf.reshape(weight, [tf.shape(weight)[0], -1])[:, 0], tf.float32)
    negative = tf.bitcast(per_example, tf.int32) < 0  # the sign bit, also of -0.0
    return tf.logical_not(tf.logical_and(tf.equal(per_example, 0.0), negative))
