"""The model and data of the multi-worker tests, in a module their worker scripts import.

A worker process imports this rather than a test module: it needs no pytest (0.23 s of
CPU in each of the suite's 40 or so worker processes).
"""

import keras
import numpy as np

import strategykit as sk

EPOCHS = 3
EXAMPLES = 96  # 6 steps of 16 on 2 workers, 4 steps of 24 on 3: no partial batch
PER_REPLICA = 8


def build_model():
    """A compiled Dense -> SyncBatchNormalization -> Dense regressor, seeded."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((5,)), keras.layers.Dense(8), sk.SyncBatchNormalization(),
        keras.layers.Activation("relu"), keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.05, momentum=0.9), "mse")
    return model


def training_data():
    rng = np.random.default_rng(7)
    x = rng.normal(size=(EXAMPLES, 5)).astype("float32")
    y = (x @ rng.normal(size=(5, 1)) + 1.0).astype("float32")
    return x, y


def validation_data(replicas):
    """`(x, y, weights)` whose final batch, of `PER_REPLICA * replicas`, holds 1 example:
    fewer than replicas. The weights go from 0 to 2."""
    x, y = training_data()
    size = 2 * PER_REPLICA * replicas + 1
    return x[:size], y[:size], np.linspace(0.0, 2.0, size).astype("float32")


def model_with_metrics(trained):
    """`build_model()` with `trained`'s weights, compiled with a metric and a weighted one."""
    model = build_model()
    model.compile("sgd", "mse", metrics=[keras.metrics.MeanAbsoluteError(name="mae")],
                  weighted_metrics=[keras.metrics.MeanSquaredError(name="weighted_mse")])
    model.set_weights(trained.get_weights())
    return model
