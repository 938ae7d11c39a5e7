"""fit() of data Keras batches itself on several replicas of a strategykit strategy: refused
where it would train differently from one device (`strategykit.upstream.keras_batches`).

A final partial batch of arrays was 5e-2 off one device after 2 epochs, a PyDataset 7e-2
with full batches; arrays of whole batches train exactly, and evaluate() is exact.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import strategykit as sk

BATCH = 16


def _data(examples):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(examples, 3))
    return x, x @ np.array([[1.0], [-2.0], [0.5]]) + rng.normal(size=(examples, 1))


def _regressor(strategy=None):
    keras.utils.set_random_seed(0)
    with (strategy or tf.distribute.get_strategy()).scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="tanh",
                                                                        dtype="float64"),
                                  keras.layers.Dense(1, dtype="float64")])
        model.compile(keras.optimizers.SGD(0.1), "mse", metrics=["mae"])
    return model


class _Batches(keras.utils.PyDataset):
    def __init__(self, x, y):
        super().__init__()
        self.x, self.y = x, y

    def __len__(self):
        return len(self.x) // BATCH

    def __getitem__(self, index):
        return self.x[index * BATCH:(index + 1) * BATCH], self.y[index * BATCH:(index + 1) * BATCH]


def test_arrays_of_whole_batches_train_as_one_device_and_a_partial_one_is_refused():
    strategy = sk.mirrored(replicas=4)
    x, y = _data(4 * BATCH)
    one, four = _regressor(), _regressor(strategy)
    for model in (one, four):
        model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    for ours, reference in zip(four.get_weights(), one.get_weights()):
        np.testing.assert_allclose(ours, reference, rtol=0, atol=1e-12)
    x, y = _data(61)
    with pytest.raises(ValueError, match=(
            r"model.fit\(\) of 61 examples in batches of 16 on 4 replicas would not train as "
            r"one device: Keras splits the final batch of 13 over the replicas .* Received: "
            r"61 examples, batch_size=16. Pass sk.shard\(\(x, y\), strategy, "
            r"global_batch_size=16\) to fit\(\)")):
        four.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    np.testing.assert_allclose(  # refused before any step; evaluate() is one device's
        four.evaluate(x, y, batch_size=BATCH, verbose=0),
        one.evaluate(x, y, batch_size=BATCH, verbose=0), rtol=1e-6)  # float32 metrics


def test_a_py_dataset_is_refused_naming_the_fix():
    strategy = sk.mirrored(replicas=4)
    model = _regressor(strategy)
    with pytest.raises(ValueError, match=(
            r"model.fit\(\) of a keras.utils.PyDataset on 4 replicas trains on other batches "
            r"than one device.* Received: x of type PyDataset. .*tf.data.Dataset.from_generator"
            r".*sk.shard\(dataset, strategy, global_batch_size=...\)")):
        model.fit(_Batches(*_data(4 * BATCH)), epochs=1, verbose=0)

