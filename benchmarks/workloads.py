"""Workloads shared by the benchmarks: small enough for a 2-core machine, big enough to time."""

from __future__ import annotations

GLOBAL_BATCH = 64
STEPS = 20


def conv_net(layers: int = 20, channels: int = 8, batch_norm=None):
    """A conv net of `layers` 3x3 convolutions on 8x8x`channels` inputs, 10 classes.

    Args:
        layers: number of convolutions.
        channels: channels of the input and of every convolution.
        batch_norm: a function returning a normalization layer, inserted after every
            convolution; None for no normalization.
    """
    import keras

    inputs = keras.Input((8, 8, channels))
    x = inputs
    for _ in range(layers):
        x = keras.layers.Conv2D(channels, 3, padding="same", use_bias=batch_norm is None)(x)
        if batch_norm is not None:
            x = batch_norm()(x)
        x = keras.layers.Activation("relu")(x)
    outputs = keras.layers.Dense(10)(keras.layers.GlobalAveragePooling2D()(x))
    return keras.Model(inputs, outputs)


def labeled_images(examples: int, channels: int = 8):
    """`(x, y)` arrays: `examples` random 8x8x`channels` float32 images, labels in 0..9."""
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.normal(size=(examples, 8, 8, channels)).astype("float32")
    return x, rng.integers(0, 10, size=examples)


def random_images(channels: int = 8, batches: int = STEPS, batch_size: int = GLOBAL_BATCH):
    """A repeating `tf.data.Dataset` of random 8x8 images and labels, already batched."""
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    x = rng.normal(size=(batch_size * batches, 8, 8, channels)).astype("float32")
    y = rng.integers(0, 10, size=len(x))
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch_size).repeat()


def fit_step_seconds_of(strategy, batch_norm=None) -> float:
    """Step time of `fit()` of `conv_net(batch_norm=...)` under `strategy`."""
    import harness

    with strategy.scope():
        model = conv_net(batch_norm=batch_norm)
        model.compile("sgd", "sparse_categorical_crossentropy")
    return harness.fit_step_seconds(model, random_images(), steps=STEPS)
