"""Every replica's `add_loss` and activity-regularization terms count, on every Keras of
the range: 4 replicas train and evaluate as one device on the global batch, in float64.

Without the fix (`strategykit.upstream.replica_losses`) each of these runs ends 1e-3
away from one device: the replicas share the layer's list of added losses and read the
last replica's after an all-reduce (exact metrics on weighted data, synchronized batch
norm); on Keras 3.8 to 3.13 an activity regularizer's term also adds up to 1/N of one
device's.
"""

import dataclasses

import keras
import numpy as np
import pytest
import tensorflow as tf

import strategykit as sk
from strategykit import upstream
from strategykit.upstream import replica_losses

from conftest import cpu_devices

REPLICAS, BATCH = 4, 16


def l1_activity(x):
    """An activity regularizer that stays float64 on every Keras (`keras.regularizers.L1`
    holds a float32 factor before Keras 3.14)."""
    return 0.01 * keras.ops.sum(keras.ops.abs(x))


class GuideActivityRegularization(keras.layers.Layer):
    """keras.io's pass-through layer that adds a loss of its inputs (as a batch mean)."""

    def call(self, inputs):
        self.add_loss(0.1 * keras.ops.mean(keras.ops.square(inputs)))
        return inputs


def build(kind: str) -> keras.Model:
    inputs = keras.Input((5,))
    regularized = kind in ("activity", "sync_bn", "keras_sync_bn", "custom_loop")
    hidden = keras.layers.Dense(
        6, activation="tanh", kernel_initializer=keras.initializers.GlorotUniform(1),
        activity_regularizer=l1_activity if regularized else None)(inputs)
    if kind == "add_loss":
        hidden = GuideActivityRegularization()(hidden)
    if kind in ("sync_bn", "custom_loop"):
        hidden = sk.SyncBatchNormalization()(hidden)
    if kind == "keras_sync_bn":
        hidden = keras.layers.BatchNormalization(synchronized=True)(hidden)
    outputs = keras.layers.Dense(1, kernel_initializer=keras.initializers.GlorotUniform(2))(
        hidden)
    model = keras.Model(inputs, outputs)
    model.compile(keras.optimizers.SGD(0.1), "mse")
    return model


def data(weighted: bool, examples: int = 64):
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(examples, 5)), rng.normal(size=(examples, 1))
    # Every replica's batch is weighted differently.
    return (x, y, rng.choice([0.5, 1.0, 1.5, 2.0], size=examples)) if weighted else (x, y)


def assert_same_weights(expected: keras.Model, model: keras.Model):
    for want, got in zip(expected.get_weights(), model.get_weights()):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("kind, weighted, sharded, examples", [
    # exact metrics all-reduce between the forward pass and the loss
    ("activity", True, True, 64),
    ("add_loss", True, True, 64),
    ("sync_bn", False, True, 64),  # sync BN's all-reduce after the regularized layer
    ("keras_sync_bn", False, False, 64),  # Keras's own synchronized BN and data path
    # sk.shard pads the final batch of 5 with copies: the terms count the real examples
    ("activity", True, True, 37),
    ("sync_bn", False, True, 37),
    ("keras_sync_bn", False, True, 37),
])
def test_added_losses_of_four_replicas_equal_one_devices(float64, kind, weighted, sharded,
                                                        examples):
    arrays = data(weighted, examples)
    expected = build(kind)
    initial = expected.get_weights()
    expected.fit(*arrays[:2], sample_weight=arrays[2] if weighted else None,
                 batch_size=BATCH, shuffle=False, verbose=0)
    expected_loss = expected.evaluate(*arrays[:2], batch_size=BATCH, verbose=0)

    strategy = sk.mirrored(cpu_devices(REPLICAS))
    with strategy.scope():
        model = build(kind)
    model.set_weights(initial)
    if sharded:
        model.fit(sk.shard(arrays, global_batch_size=BATCH, strategy=strategy), verbose=0)
    else:
        model.fit(*arrays[:2], batch_size=BATCH, shuffle=False, verbose=0)
    assert_same_weights(expected, model)
    loss = model.evaluate(sk.shard(arrays[:2], global_batch_size=BATCH, strategy=strategy),
                          verbose=0)
    np.testing.assert_allclose(loss, expected_loss, rtol=1e-12)


@pytest.mark.slow
def test_a_custom_loop_reads_each_replicas_added_losses(float64):
    x, y = data(weighted=False)
    expected, optimizer = build("custom_loop"), keras.optimizers.SGD(0.1)
    initial = expected.get_weights()

    def step(model, optimizer, x, y, replicas):
        with tf.GradientTape() as tape:
            prediction = model(x, training=True)
            loss = tf.reduce_sum(tf.square(prediction - y)) / BATCH
            loss += tf.add_n(model.losses) / replicas
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))

    for start in range(0, 64, BATCH):
        step(expected, optimizer, x[start:start + BATCH], y[start:start + BATCH], 1)

    strategy = sk.mirrored(cpu_devices(REPLICAS))
    with strategy.scope():
        model, optimizer = build("custom_loop"), keras.optimizers.SGD(0.1)
        optimizer.build(model.trainable_variables)
    model.set_weights(initial)

    @tf.function
    def distributed_step(x, y, sample_weight):  # all ones: 64 examples fill 4 batches
        strategy.run(step, args=(model, optimizer, x, y, REPLICAS))

    for batch in sk.shard((x, y), global_batch_size=BATCH, strategy=strategy):
        distributed_step(*batch)
    assert_same_weights(expected, model)


def test_on_unknown_keras_code_adding_a_loss_on_several_replicas_refuses(float64):
    strategy = sk.mirrored(cpu_devices(2))  # installs the fixes: before the unknown one
    with strategy.scope():
        plain, regularized = build("plain"), build("add_loss")
    unknown = dataclasses.replace(
        replica_losses.PER_REPLICA_LOSSES,
        relies_on={"keras.src.layers.layer:Layer.losses": "0000000000000000"})
    replica_losses.PER_REPLICA_LOSSES.uninstall()
    try:
        assert unknown.install() is False
        assert unknown.state() == "refusing"
        x, y = data(weighted=False)
        plain.fit(x, y, batch_size=BATCH, verbose=0)  # no added loss: upstream's own code
        with pytest.raises(upstream.UnknownUpstreamCode,
                           match=r"cannot make add_loss and activity regularizers on several "
                                 r"replicas work on TensorFlow .*Layer\.losses"):
            regularized.fit(x, y, batch_size=BATCH, verbose=0)
    finally:
        unknown.uninstall()
        replica_losses.PER_REPLICA_LOSSES.install()
