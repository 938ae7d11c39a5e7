"""Replica drift of unsynchronized batch norm: measured at epoch end, averaged on request."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from strategykit import callbacks
from strategykit.callbacks.replica_drift import replica_copies


def bn_model():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((2,)), keras.layers.BatchNormalization(momentum=0.5),
                              keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.01), "mse")
    return model


def one_global_batch():
    """8 examples; replica k (examples 2k, 2k+1) sees inputs around 3k: its own statistics."""
    x = np.array([[0, 1], [1, 0], [3, 4], [4, 2], [6, 8], [7, 5], [9, 9], [12, 10]], "float32")
    return x, x.sum(axis=1, keepdims=True)


def fit_bn(strategy, **options):
    with strategy.scope():
        model = bn_model()
    x, y = one_global_batch()
    callback = callbacks.CrossReplicaLoss(**options)
    history = model.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False,
                        callbacks=[callback])
    return model, history.history, callback


def test_drift_is_the_largest_difference_between_replica_copies(make_strategy):
    strategy = make_strategy(4)
    model, history, callback = fit_bn(strategy)
    expected = max(
        float(np.max(np.abs(copy - copies[0])))
        for variable in model.weights
        for copies in [replica_copies(variable, strategy)]
        for copy in copies[1:]
    )
    assert expected > 0.5  # each replica's moving statistics followed its own inputs
    assert history["replica_drift"] == pytest.approx([expected])
    assert callback.drift == pytest.approx([expected])


def test_sync_moving_stats_gives_every_copy_the_global_statistics(make_strategy):
    strategy = make_strategy(4)
    unsynced, _, _ = fit_bn(strategy)
    model, history, _ = fit_bn(strategy, sync_moving_stats=True)
    assert history["replica_drift"][0] > 0.5  # measured before averaging

    reference = bn_model()  # one device, the same global batch
    x, y = one_global_batch()
    reference.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)

    layer, unsynced_layer = model.layers[0], unsynced.layers[0]
    for copy in replica_copies(layer.moving_mean, strategy):
        np.testing.assert_allclose(copy, reference.layers[0].moving_mean.numpy(), rtol=1e-6)
    expected_variance = np.mean(replica_copies(unsynced_layer.moving_variance, strategy), axis=0)
    for copy in replica_copies(layer.moving_variance, strategy):
        np.testing.assert_allclose(copy, expected_variance, rtol=1e-6)
    # What a saved model keeps (replica 0's copy) is now the global moving mean.
    np.testing.assert_allclose(model.get_weights()[2], reference.get_weights()[2], rtol=1e-6)


def test_one_device_logs_no_drift():
    _, history, callback = fit_bn(tf.distribute.get_strategy())
    assert "replica_drift" not in history and callback.drift == []
