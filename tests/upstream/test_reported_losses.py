"""A loss a custom `train_step` reports through a metric is one device's value on N
replicas (`strategykit.upstream.reported_losses`): without the fix keras.io's custom
steps report 1/N of it, under plain `tf.distribute` too."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import strategykit as sk

from conftest import cpu_devices

REPLICAS, BATCH = 4, 16


class GuideModel(keras.Model):
    """keras.io's "Customizing what happens in fit()": `compute_loss`, then a tracker."""

    def __init__(self, *args, loss_fn=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.loss_fn = loss_fn
        self.loss_tracker = keras.metrics.Mean(name="loss")
        self.loss_sum = keras.metrics.Sum(name="loss_sum")

    def train_step(self, data):
        x, y = data[:2]
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            if self.loss_fn is None:
                loss = self.compute_loss(y=y, y_pred=y_pred)
            else:  # the GAN guide's way: a keras.losses.Loss object
                loss = self.loss_fn(y, y_pred)
        gradients = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(gradients, self.trainable_variables))
        self.loss_tracker.update_state(loss)
        self.loss_sum.update_state(loss)
        return {m.name: m.result() for m in self.metrics}

    @property
    def metrics(self):
        return [self.loss_tracker, self.loss_sum]


def build(loss_fn):
    inputs = keras.Input((3,))
    outputs = keras.layers.Dense(1, kernel_initializer="ones")(inputs)
    model = GuideModel(inputs, outputs, loss_fn=loss_fn)
    model.compile(keras.optimizers.SGD(0.05), loss="mse")
    return model


@pytest.mark.parametrize("loss_fn", [None, keras.losses.MeanSquaredError()],
                         ids=["compute_loss", "loss_object"])
def test_a_custom_steps_reported_loss_equals_one_devices(loss_fn):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 3)).astype("float32")
    y = (x @ np.array([[0.5], [-1.0], [2.0]])).astype("float32")
    expected = build(loss_fn).fit(x, y, batch_size=BATCH, epochs=2, shuffle=False,
                                  verbose=0).history
    strategy = sk.mirrored(cpu_devices(REPLICAS))
    with strategy.scope():
        model = build(loss_fn)
    history = model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0).history
    # Without the fix: a quarter of it (3.2 for 12.7).
    np.testing.assert_allclose(history["loss"], expected["loss"], rtol=1e-5)
    # A Sum adds every replica's scaled loss: already one device's, left as it is.
    np.testing.assert_allclose(history["loss_sum"], expected["loss_sum"], rtol=1e-5)


def test_a_value_computed_from_the_loss_is_added_as_it_is():
    strategy = sk.mirrored(cpu_devices(2))
    with strategy.scope():
        tracker, doubled = keras.metrics.Mean(), keras.metrics.Mean()
        loss_fn = keras.losses.MeanSquaredError()

    @tf.function
    def step(y):
        def replica(y):
            loss = loss_fn(y, tf.zeros_like(y))  # scaled by 1/2 and marked
            tracker.update_state(loss)
            doubled.update_state(loss * 2.0)  # the user's own unscaling: left alone
        strategy.run(replica, args=(y,))

    step(tf.ones((4, 1)))
    assert float(tracker.result()) == pytest.approx(1.0)
    assert float(doubled.result()) == pytest.approx(1.0)
