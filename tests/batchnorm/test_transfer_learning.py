"""keras.io's transfer-learning flow on 2 replicas equals one device, padded batch included.

The sync-BN guide's fine-tuning section (docs/guides/sync-batchnorm.md), as keras.io's
transfer-learning guide writes it: a base of MobileNetV2's blocks (small, untrained, its
moving statistics set away from 0 and 1), frozen and called with `training=False` after a
`Rescaling`, converted to synchronized batch norm in the scope, a Dense head trained;
then the base unfrozen, the model recompiled in the scope with Adam(1e-5) and
fine-tuned, validated on `sk.shard` data. Once unfrozen, Keras 3 trains the base's batch
norm on batch statistics (it does not keep `training=False`), so the final batch of 5
that `sk.shard` fills up with copies must leave them out of the moments.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import strategykit as sk

from conftest import assert_same_as_one_device, cpu_devices

TRAIN, VALIDATION, GLOBAL_BATCH, SIZE = 37, 21, 16, 16


def _small_mobilenet():
    """MobileNetV2's stem and one inverted residual block (expand, depthwise, project,
    each with batch norm). `keras.applications.MobileNetV2(alpha=0.35)` passes this test
    too (measured: 143 s, too slow for the suite)."""
    inputs = keras.Input((SIZE, SIZE, 3))
    x = keras.layers.Conv2D(8, 3, strides=2, padding="same", use_bias=False)(inputs)
    x = keras.layers.ReLU(6.0)(keras.layers.BatchNormalization()(x))
    y = keras.layers.Conv2D(16, 1, use_bias=False)(x)
    y = keras.layers.ReLU(6.0)(keras.layers.BatchNormalization()(y))
    y = keras.layers.DepthwiseConv2D(3, padding="same", use_bias=False)(y)
    y = keras.layers.ReLU(6.0)(keras.layers.BatchNormalization()(y))
    y = keras.layers.BatchNormalization()(keras.layers.Conv2D(8, 1, use_bias=False)(y))
    return keras.Model(inputs, keras.layers.Add()([x, y]), name="base")


def _model(strategy):
    with strategy.scope():
        keras.utils.set_random_seed(0)
        base_model = _small_mobilenet()
        rng = np.random.default_rng(0)
        for layer in base_model.layers:  # as a pretrained base's: away from 0 and 1
            if isinstance(layer, keras.layers.BatchNormalization):
                layer.moving_mean.assign(rng.normal(0, 0.1, layer.moving_mean.shape))
                layer.moving_variance.assign(rng.uniform(0.5, 2.0, layer.moving_variance.shape))
        base_model.trainable = False
        inputs = keras.Input((SIZE, SIZE, 3))
        x = keras.layers.Rescaling(scale=1 / 127.5, offset=-1)(inputs)
        x = base_model(x, training=False)
        x = keras.layers.GlobalAveragePooling2D()(x)
        model = sk.convert_sync_batchnorm(keras.Model(inputs, keras.layers.Dense(1)(x)))
        model.compile(keras.optimizers.Adam(), keras.losses.BinaryCrossentropy(from_logits=True))
    return base_model, model


def _data(examples, seed):
    rng = np.random.default_rng(seed)
    return rng.uniform(0, 255, (examples, SIZE, SIZE, 3)), rng.integers(0, 2, (examples, 1))


def _flow(strategy, sharded: bool):
    base_model, model = _model(strategy)
    train, validation = _data(TRAIN, 1), _data(VALIDATION, 2)
    if sharded:
        train = {"x": sk.shard(train, strategy, global_batch_size=GLOBAL_BATCH)}
        validation = sk.shard(validation, strategy, global_batch_size=GLOBAL_BATCH)
    else:
        train = {"x": train[0], "y": train[1], "batch_size": GLOBAL_BATCH, "shuffle": False}
    head = model.fit(**train, validation_data=validation, epochs=1, verbose=0)
    base_model.trainable = True
    with strategy.scope():
        model.compile(keras.optimizers.Adam(1e-5),
                      keras.losses.BinaryCrossentropy(from_logits=True))
    tuned = model.fit(**train, validation_data=validation, epochs=1, verbose=0)
    return model, {**head.history, **{f"tuned_{k}": v for k, v in tuned.history.items()}}


@pytest.mark.slow
def test_the_fine_tuning_flow_on_two_replicas_equals_one_device(float64):
    one, one_history = _flow(tf.distribute.get_strategy(), sharded=False)
    model, history = _flow(sk.mirrored(cpu_devices(2)), sharded=True)
    assert_same_as_one_device(model, one, history, one_history)
