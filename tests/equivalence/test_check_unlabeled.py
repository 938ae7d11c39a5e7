"""`sk.check` on models trained on inputs alone, and steps whose update is N x one device's.

keras.io's VAE trains on `x` with a custom `train_step` whose loss is written by hand as
a batch mean (`ops.mean(...)`), its gradients taken from the tape: on N replicas the
summed gradients are N times one device's. `sk.check` takes such data (arrays, dicts,
`tf.data`) and names the factor; the same step scaled for the replicas passes.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras import ops

import strategykit as sk

from conftest import cpu_devices

REPLICAS = 4


class Autoencoder(keras.Model):
    """keras.io's VAE step, reduced: a hand-written mean loss, gradients from the tape."""

    def __init__(self, scaled: bool, **kwargs):
        super().__init__(**kwargs)
        self.scaled = scaled
        self.encoder = keras.layers.Dense(2, activation="tanh")
        self.decoder = keras.layers.Dense(3)
        self.loss_tracker = keras.metrics.Mean(name="loss")

    def call(self, x):
        x = x["pixels"] if isinstance(x, dict) else x
        return self.decoder(self.encoder(x))

    @property
    def metrics(self):
        return [self.loss_tracker]

    def train_step(self, data):
        x = data["pixels"] if isinstance(data, dict) else data
        with tf.GradientTape() as tape:
            loss = ops.mean(ops.sum(ops.square(x - self(x, training=True)), axis=1))
            scaled = loss
            if self.scaled:  # what the report asks for
                scaled = loss / tf.distribute.get_strategy().num_replicas_in_sync
        grads = tape.gradient(scaled, self.trainable_weights)
        self.optimizer.apply_gradients(zip(grads, self.trainable_weights))
        self.loss_tracker.update_state(loss)
        return {"loss": self.loss_tracker.result()}


def autoencoder(scaled: bool):
    def model_fn():
        keras.utils.set_random_seed(1)
        model = Autoencoder(scaled)
        model.compile(keras.optimizers.SGD(0.1))
        model(np.zeros((1, 3), "float32"))  # built: the check compares its first update
        return model
    return model_fn


def pixels(examples=48):
    return np.random.default_rng(0).normal(size=(examples, 3)).astype("float32")


@pytest.mark.parametrize("given", [lambda x: x, lambda x: (x,),
                                   lambda x: tf.data.Dataset.from_tensor_slices(x)],
                         ids=["array", "1-tuple", "tf.data"])
def test_a_loss_not_scaled_for_the_replicas_is_named_with_its_factor(given):
    strategy = sk.mirrored(cpu_devices(REPLICAS))
    report = sk.check(autoencoder(scaled=False), given(pixels()), strategy=strategy)
    assert not report.passed
    assert report.update_factor == pytest.approx(REPLICAS)
    assert ("the update is 4.00x one device's: the step's loss is a per-replica mean that "
            "is not scaled for 4 replicas; use self.compute_loss(...) or multiply by "
            "1/num_replicas_in_sync") in str(report)


def test_the_same_step_scaled_for_the_replicas_passes():
    report = sk.check(autoencoder(scaled=True), pixels(), strategy=sk.mirrored(
        cpu_devices(REPLICAS)))
    assert report.passed, str(report)
    assert report.update_factor is None
    assert "loss" in report.single_device_logs


def test_a_dict_of_inputs_alone():
    report = sk.check(autoencoder(scaled=True), {"pixels": pixels()}, replicas=2)
    assert report.passed, str(report)


def test_a_batched_dataset_is_refused():
    with pytest.raises(ValueError, match=r"data is already batched"):
        sk.check(autoencoder(scaled=True), tf.data.Dataset.from_tensor_slices(pixels())
                 .batch(8), replicas=2)


def test_labeled_tf_data_is_read_as_arrays():
    def model_fn():
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        model.compile(keras.optimizers.SGD(0.1), "mse")
        return model

    x = pixels()
    report = sk.check(model_fn, tf.data.Dataset.from_tensor_slices((x, x.sum(1))), replicas=2)
    assert report.passed, str(report)
    assert set(report.single_device_metrics) == {"loss"}
