"""Metric variables are synchronized on read under a strategy, on every Keras of the range
(keras-team/keras#21061: Keras 3.8 and 3.9 mirror them, strategykit's fix does not)."""

import keras
import numpy as np
import tensorflow as tf

import strategykit as sk
from strategykit import upstream


def test_metric_variables_are_read_synchronized_and_layer_weights_mirrored():
    upstream.install()
    strategy = sk.mirrored(replicas=2)
    with strategy.scope():
        metric = keras.metrics.Mean()
        layer = keras.layers.Dense(1)
        layer.build((None, 3))
    assert {v.value.synchronization for v in metric.variables} == {
        tf.VariableSynchronization.ON_READ}
    assert {v.value.synchronization for v in layer.weights} != {
        tf.VariableSynchronization.ON_READ}


def test_a_mean_of_different_labels_on_each_replica_equals_one_devices():
    # Batches of 16 split 8 + 8: the first batch all ones, the rest zeros. Mirrored metric
    # variables (Keras 3.8 without the fix) reported 0.53 for the mean of 0.25.
    upstream.install()
    x = np.arange(64, dtype="float32")[:, None]
    y = (np.arange(64) < 16).astype("float32")

    class LabelMean(keras.metrics.Mean):
        def update_state(self, y_true, y_pred, sample_weight=None):
            return super().update_state(y_true)

    strategy = sk.mirrored(replicas=2)
    with strategy.scope():
        model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(
            1, kernel_initializer="zeros", bias_initializer="zeros")])
        model.compile("sgd", "mse", metrics=[LabelMean(name="label_mean")])
    logs = model.evaluate(x, y, batch_size=16, verbose=0, return_dict=True)
    assert logs["label_mean"] == 0.25
    assert logs["loss"] == 0.25  # zero predictions: the mean of y squared
