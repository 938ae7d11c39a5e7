"""`SyncBatchNormalization`: batch norm with moments over the global batch of all replicas.

With small per-device batches (segmentation, large images) each replica's own batch
gives noisy moments; this layer normalizes with the mean and variance of the whole
global batch instead, computed with one all-reduce per layer per step (see
`strategykit.batches.moments`). Everywhere else (outside a strategy, one replica, inference) it
is `keras.layers.BatchNormalization` unchanged.
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf
from keras import ops

from strategykit.batches.moments import cross_replica_moments, over_real_examples
from strategykit.upstream import saved_layers


@keras.saving.register_keras_serializable(package="strategykit")
class SyncBatchNormalization(keras.layers.BatchNormalization):
    """Batch normalization synchronized across replicas, with one all-reduce per call.

    Takes the arguments of `keras.layers.BatchNormalization` (`axis=-1`, `momentum=0.99`,
    `epsilon=1e-3`, `center`, `scale`, initializers, regularizers, constraints). In
    training, inside `strategy.run` or `model.fit` with more than one replica, the mean
    and variance are those of the global batch: every replica's examples, weighted by
    their real counts (an uneven last batch, or a replica with none, is right), the
    mask respected, the padded copies of `sk.shard`'s final batch left out (one device
    never sees them), the variance computed without cancellation, in float32 under
    `mixed_float16` and `mixed_bfloat16`. The moving statistics are therefore identical
    on every replica, and so is inference, which uses them. Outside any strategy, with
    one replica, or in inference the layer is exactly `keras.layers.BatchNormalization`.

    Every replica must call the layer the same number of times per step: the all-reduce
    waits for all of them, so a replica that skips a call (a data-dependent branch, a
    replica without a batch while the others have one) hangs the step.

    Cost: one all-reduce of `replicas x (2C + 1)` floats per layer in the forward pass
    and one of `2C` floats in the backward pass (Keras's `synchronized=True`: three and
    two). The collectives are sequential, so on small activations their latency
    dominates. It pays off when each replica sees few examples (say under 16:
    segmentation, detection, large images); with large per-replica batches local
    moments are nearly as good and plain `BatchNormalization` is cheaper.

    Saved to a `.keras` file (`model.save`, `ModelCheckpoint`) it is written as Keras's
    own `BatchNormalization(synchronized=True)`, so that plain Keras loads the file where
    strategykit is not installed (`strategykit.upstream.saved_layers`).

    Args:
        synchronized: accepted for compatibility with `BatchNormalization` configs;
            only `True` (the default) is valid, since this layer is always synchronized.
        renorm: not supported; only `False` (the default) is valid.
        **kwargs: the other arguments of `keras.layers.BatchNormalization`.

    Raises:
        ValueError: `synchronized=False`, `renorm=True`, an `axis` that is not one int
            (a list of axes: Keras's `BatchNormalization` takes one too), or, when
            built, inputs of rank 1 (no channel axis beside the batch).

    Example:
        >>> import keras, strategykit as sk
        >>> model = keras.Sequential([
        ...     keras.Input((8, 8, 3)),
        ...     keras.layers.Conv2D(16, 3, use_bias=False),
        ...     sk.SyncBatchNormalization(momentum=0.9),
        ...     keras.layers.ReLU(),
        ... ])
        >>> model.output_shape
        (None, 6, 6, 16)
    """

    def __init__(self, *args, synchronized=True, renorm=False, **kwargs):
        if synchronized is not True:
            raise ValueError(
                "SyncBatchNormalization is always synchronized across replicas. Received: "
                f"synchronized={synchronized!r}. Use keras.layers.BatchNormalization for "
                "per-replica moments, or drop the argument."
            )
        if renorm:
            raise ValueError(
                "SyncBatchNormalization does not support batch renormalization. Received: "
                f"renorm={renorm!r}. Use keras.layers.BatchNormalization(renorm=True, "
                "synchronized=True) for synchronized renormalization."
            )
        axis = args[0] if args else kwargs.get("axis", -1)
        if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
            raise ValueError(
                "SyncBatchNormalization normalizes one channel axis, as "
                "keras.layers.BatchNormalization does (its axis is an int). Received: "
                f"axis={axis!r}. Pass one axis, e.g. axis=-1; for moments over several "
                "axes, merge them into one first (keras.layers.Reshape).")
        # The parent's own synchronization stays off: this class does it in `call`, and
        # where it delegates to the parent (one replica, inference) none is needed.
        super().__init__(*args, synchronized=False, **kwargs)
        track_saved_layer(self)

    def build(self, input_shape):
        if len(input_shape) < 2:
            raise ValueError(
                "SyncBatchNormalization needs inputs of rank 2 or more, (batch, ..., "
                "channels): in rank 1 the one axis is the batch, which the replicas split, "
                f"so there is no channel to normalize. Received: input_shape={input_shape}. "
                "Give the inputs a channel axis: x[:, None], or keras.layers.Reshape((1,)).")
        super().build(input_shape)

    def call(self, inputs, training=None, mask=None):
        context = tf.distribute.get_replica_context()
        if not (training and self.trainable) or context is None or (
            context.num_replicas_in_sync == 1
        ):
            return super().call(inputs, training=training, mask=mask)
        if mask is not None and len(mask.shape) != len(inputs.shape) - 1:
            raise ValueError(
                "The mask must have one dimension less than the inputs. Received: "
                f"mask.shape={mask.shape}, inputs.shape={inputs.shape}. Pass a mask of "
                "shape inputs.shape without the channel axis."
            )
        # Moments in float32 at least, also under mixed_float16 / mixed_bfloat16.
        inputs = ops.cast(inputs, keras.backend.result_type(inputs.dtype, "float32"))
        rank = len(inputs.shape)
        channel_axis = self.axis % rank
        axes = [axis for axis in range(rank) if axis != channel_axis]
        if mask is not None:
            mask = ops.expand_dims(ops.cast(mask, "bool"), axis=channel_axis)
        mask = over_real_examples(inputs, mask)  # not the padded copies of sk.shard
        mean, variance = cross_replica_moments(inputs, axes, mask, context)

        momentum = self.momentum
        self.moving_mean.assign(
            ops.cast(self.moving_mean, mean.dtype) * momentum + mean * (1.0 - momentum)
        )
        self.moving_variance.assign(
            ops.cast(self.moving_variance, mean.dtype) * momentum
            + variance * (1.0 - momentum)
        )
        outputs = ops.batch_normalization(
            inputs,
            mean=mean,
            variance=variance,
            axis=self.axis,
            offset=None if self.beta is None else ops.cast(self.beta, inputs.dtype),
            scale=None if self.gamma is None else ops.cast(self.gamma, inputs.dtype),
            epsilon=self.epsilon,
        )
        return ops.cast(outputs, self.compute_dtype)

    def get_config(self):
        config = super().get_config()
        # Always synchronized; renorm is rejected. Neither belongs in the config.
        config.pop("synchronized", None)
        config.pop("renorm", None)
        config.pop("renorm_clipping", None)
        config.pop("renorm_momentum", None)
        return config


def track_saved_layer(layer: SyncBatchNormalization) -> None:
    """Makes `.keras` files save `layer` as Keras's `BatchNormalization(synchronized=True)`,
    which plain Keras loads (`strategykit.upstream.saved_layers`)."""
    saved_layers.track(layer)


saved_layers.save_as(SyncBatchNormalization, keras.layers.BatchNormalization, synchronized=True)
