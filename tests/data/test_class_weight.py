"""fit(sk.shard(...), class_weight=...): N replicas train and report as one device.

One device runs Keras as it is, on numpy arrays in batches of the global batch size;
the replicas run on `sk.shard` data, whose final partial batch is padded. Each replica
gets different examples and classes, so weighting or padding them the wrong way shows.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import strategykit as sk
from strategykit.made import remade_data
from strategykit.upstream import class_weights

CLASS_WEIGHT = {0: 0.5, 1: 2.0}
GLOBAL_BATCH = 8


def binary_data(size, seed):
    rng = np.random.default_rng(seed)
    # float32 values in float64: Keras casts numpy data to float32 (floatx) on one device
    x = rng.normal(size=(size, 3)).astype("float32").astype("float64")
    y = (x[:, 0] + rng.normal(size=size) > 0).astype("float64")
    weights = rng.choice([0.5, 1.0, 3.0], size=size).astype("float32")
    return x, y, weights


def float64_model():
    keras.utils.set_random_seed(7)
    model = keras.Sequential([keras.Input((3,), dtype="float64"),
                              keras.layers.Dense(1, activation="sigmoid", dtype="float64")])
    model.compile(keras.optimizers.SGD(0.5), keras.losses.BinaryCrossentropy(dtype="float64"),
                  metrics=["accuracy"], weighted_metrics=["accuracy", "mse"])
    return model


def as_class_weights(y):
    return np.vectorize(CLASS_WEIGHT.get)(y.astype(int)).astype("float32")


@pytest.mark.parametrize("user_weights", [False, True], ids=["class_weight", "both"])
@pytest.mark.parametrize("replicas", [4, 1], ids=["4_replicas", "no_strategy"])
def test_class_weight_trains_and_reports_as_one_device(make_strategy, replicas, user_weights):
    # 26 = 3 x 8 + 2: on 4 replicas the final step holds 1 real example on each of
    # replicas 0 and 1 (weighed up by 8 / 2) and copies only on replicas 2 and 3. Without
    # a strategy (the default one) sk.shard gives one device Keras's batches.
    x, y, w = binary_data(26, seed=1)
    x_val, y_val, _ = binary_data(13, seed=2)  # a padded final batch of 5
    data = (x, y, w) if user_weights else (x, y)
    # Keras takes class_weight or sample_weight, not both: one device gets their product.
    one_device_weights = ({"sample_weight": w * as_class_weights(y)} if user_weights
                          else {"class_weight": CLASS_WEIGHT})
    one_device = float64_model()
    expected = one_device.fit(x, y, batch_size=GLOBAL_BATCH, epochs=2, shuffle=False, verbose=0,
                              validation_data=(x_val, y_val), **one_device_weights).history

    strategy = make_strategy(4) if replicas == 4 else tf.distribute.get_strategy()
    with strategy.scope():
        model = float64_model()
    shard = lambda *data: sk.shard(data, strategy, global_batch_size=GLOBAL_BATCH)  # noqa: E731
    history = model.fit(shard(*data), epochs=2, class_weight=CLASS_WEIGHT, shuffle=False,
                        verbose=0, validation_data=shard(x_val, y_val)).history

    for got, want in zip(model.get_weights(), one_device.get_weights(), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)
    assert set(history) == set(expected)
    for key in expected:
        np.testing.assert_allclose(history[key], expected[key], rtol=1e-6, err_msg=key)
    evaluated = model.evaluate(shard(x_val, y_val), verbose=0, return_dict=True)
    assert evaluated == pytest.approx(
        one_device.evaluate(x_val, y_val, batch_size=GLOBAL_BATCH, verbose=0,
                            return_dict=True), rel=1e-6)
    # The class weights matter here: one device trained without them differs.
    unweighted = float64_model()
    unweighted.fit(x, y, batch_size=GLOBAL_BATCH, epochs=2, shuffle=False, verbose=0,
                   sample_weight=w if user_weights else None)
    assert np.max(np.abs(unweighted.get_weights()[0] - one_device.get_weights()[0])) > 1e-3


def test_padded_copies_keep_their_weight_with_class_weights(make_strategy):
    # A class weight multiplies real examples' weights; a padded copy stays -0.0 (what
    # keeps it out of Keras's metrics), also where the class weight is 0.
    strategy = make_strategy(4)
    ids = np.arange(10)
    ds = sk.shard((ids, ids % 2), strategy, global_batch_size=8)
    remade = remade_data.remaker_of(ds)(class_weights=lambda x, y: tf.gather([0.0, 3.0], y))
    *_, final = list(remade)
    weights = [t.numpy().tolist() for t in strategy.experimental_local_results(final[2])]
    # 2 real examples (8 and 9, of classes 0 and 1), weighed up by 8 / 2.
    assert weights == [[0.0, -0.0], [12.0, -0.0], [-0.0, -0.0], [-0.0, -0.0]]
    assert [np.signbit(w).tolist() for w in weights] == [
        [False, True], [False, True], [True, True], [True, True]]


@pytest.mark.parametrize("replicas", [4, 1], ids=["4_replicas", "no_strategy"])
def test_class_weight_on_data_without_labels_says_what_to_pass(make_strategy, replicas):
    strategy = make_strategy(4) if replicas == 4 else tf.distribute.get_strategy()
    with strategy.scope():
        model = float64_model()
    data = sk.shard(np.zeros((8, 3)), strategy, global_batch_size=8)
    with pytest.raises(ValueError, match=r"class_weight needs labels, and this sk\.shard data "
                       r"holds features only\. Received: class_weight=\{0: 0\.5, 1: 2\.0\} "
                       r"and data of element_spec=.*\. Pass \(x, y\) to sk\.shard"):
        model.fit(data, class_weight=CLASS_WEIGHT, verbose=0)


def test_keras_cannot_map_class_weights_over_distributed_data_without_the_fix(make_strategy):
    # What strategykit/upstream/class_weights.py fixes (tensorflow/tensorflow#41290): when
    # this fails, Keras takes class_weight with distributed data itself; then re-check
    # the fix.
    strategy = make_strategy(2)
    with strategy.scope():
        model = float64_model()
    data = sk.shard(binary_data(8, seed=0)[:2], strategy, global_batch_size=8)  # installs
    for fix in class_weights.FIXES:
        fix.uninstall()
    try:
        with pytest.raises(AttributeError, match="has no attribute 'map'"):
            model.fit(data, class_weight=CLASS_WEIGHT, verbose=0)
    finally:
        for fix in class_weights.FIXES:
            fix.install()
