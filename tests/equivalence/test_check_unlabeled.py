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


class Sampling(keras.layers.Layer):
    """keras.io's VAE sampling layer; `with_training` adds what sk.check asks for."""

    def __init__(self, with_training=True, **kwargs):
        super().__init__(**kwargs)
        self.seed_generator = keras.random.SeedGenerator(1337)
        if not with_training:
            self.call = self.draw

    def call(self, inputs, training=None):
        return self.draw(inputs) if training else inputs[0]

    def draw(self, inputs):
        z_mean, z_log_var = inputs
        batch, dim = ops.shape(z_mean)[0], ops.shape(z_mean)[1]
        epsilon = keras.random.normal(shape=(batch, dim), seed=self.seed_generator)
        return z_mean + ops.exp(0.5 * z_log_var) * epsilon


class VAE(keras.Model):
    """keras.io's VAE as written: no call(), its train_step computes the loss."""

    def __init__(self, encoder, decoder, **kwargs):
        super().__init__(**kwargs)
        self.encoder, self.decoder = encoder, decoder
        self.total_loss_tracker = keras.metrics.Mean(name="total_loss")

    @property
    def metrics(self):
        return [self.total_loss_tracker]

    def train_step(self, data):
        with tf.GradientTape() as tape:
            z_mean, z_log_var, z = self.encoder(data)
            reconstruction = self.decoder(z)
            reconstruction_loss = ops.mean(ops.sum(
                keras.losses.binary_crossentropy(data, reconstruction), axis=(1, 2)))
            kl_loss = -0.5 * (1 + z_log_var - ops.square(z_mean) - ops.exp(z_log_var))
            total_loss = reconstruction_loss + ops.mean(ops.sum(kl_loss, axis=1))
        grads = tape.gradient(total_loss, self.trainable_weights)
        self.optimizer.apply_gradients(zip(grads, self.trainable_weights))
        self.total_loss_tracker.update_state(total_loss)
        return {"loss": self.total_loss_tracker.result()}


def make_vae(with_training=True):
    def model_fn():
        keras.utils.set_random_seed(0)
        inputs = keras.Input(shape=(6, 6, 1))
        x = keras.layers.Dense(8, activation="relu")(keras.layers.Flatten()(inputs))
        z_mean, z_log_var = keras.layers.Dense(2)(x), keras.layers.Dense(2)(x)
        z = Sampling(with_training, name="sampling")([z_mean, z_log_var])
        encoder = keras.Model(inputs, [z_mean, z_log_var, z], name="encoder")
        latent = keras.Input(shape=(2,))
        decoded = keras.layers.Reshape((6, 6, 1))(
            keras.layers.Dense(36, activation="sigmoid")(latent))
        vae = VAE(encoder, keras.Model(latent, decoded, name="decoder"))
        vae.compile(optimizer=keras.optimizers.Adam())
        return vae
    return model_fn


def digits(examples=48):
    return np.random.default_rng(0).uniform(size=(examples, 6, 6, 1)).astype("float32")


def test_keras_ios_vae_without_call_under_adam_fails_naming_the_4x_update():
    report = sk.check(make_vae(), digits(), strategy=sk.mirrored(cpu_devices(REPLICAS)))
    assert not report.passed
    assert report.update_factor == pytest.approx(REPLICAS)  # Adam's update hides it: SGD's
    assert "the update is 4.00x one device's" in str(report)
    assert "randomness off in 1 layer: encoder/sampling (Sampling)" in str(report)


def test_a_random_layer_without_a_training_argument_is_refused_by_name():
    with pytest.raises(ValueError, match=r"layer 'encoder/sampling' draws random numbers "
                                         r"in every call.*Received: 1 such layer "
                                         r"\(encoder/sampling\)\. Give its call\(\) a "
                                         r"training argument"):
        sk.check(make_vae(with_training=False), digits(), replicas=2)
