"""Gradient clipping under several replicas clips the global batch's gradient.

One device clips the gradient of the global batch; Keras under a strategy clipped each
replica's gradient before the all-reduce (`strategykit.upstream.gradient_clipping`).
The targets are large, so every option clips at every step, and each replica gets other
examples: a per-replica clip differs from one device's by 1e-2 after 4 steps.
"""


import keras
import numpy as np
import pytest
import tensorflow as tf

import strategykit as sk
from strategykit.upstream import gradient_clipping

from conftest import cpu_devices
from workers import run_workers

GLOBAL_BATCH = 16
STEPS = 4
TOLERANCE = 1e-6

CLIPPING = {"global_clipnorm": {"global_clipnorm": 0.1}, "clipnorm": {"clipnorm": 0.1},
            "clipvalue": {"clipvalue": 0.01}}


def _data(examples=STEPS * GLOBAL_BATCH - 5):  # a final batch of 11, padded by sk.shard
    rng = np.random.default_rng(0)
    x = rng.normal(size=(examples, 3)).astype("float32")
    y = x @ np.array([[10.0], [-20.0], [5.0]], "float32") + 30 * rng.normal(size=(examples, 1))
    return x, y.astype("float32")


def _regressor(clipping="global_clipnorm", loss_scale=False):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="tanh"),
                              keras.layers.Dense(1)])
    optimizer = keras.optimizers.SGD(0.1, momentum=0.5, **CLIPPING[clipping])
    if loss_scale:
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer, initial_scale=2.0 ** 10)
    model.compile(optimizer, "mse")
    return model


def _weights(model) -> list:
    return [np.asarray(w) for w in model.get_weights()]


def _difference(weights, reference) -> float:
    return max(float(np.abs(np.asarray(a) - b).max())
               for a, b in zip(weights, reference, strict=True))


def _one_device(clipping="global_clipnorm", loss_scale=False) -> list:
    model = _regressor(clipping, loss_scale)
    model.fit(*_data(), batch_size=GLOBAL_BATCH, shuffle=False, verbose=0)
    return _weights(model)


def _replicated(clipping="global_clipnorm", loss_scale=False, replicas=4):
    """The model and its fit on `replicas` replicas, `fit()` not yet called."""
    strategy = sk.mirrored(cpu_devices(replicas))
    with strategy.scope():
        model = _regressor(clipping, loss_scale)
    data = sk.shard(_data(), strategy, global_batch_size=GLOBAL_BATCH)
    return model, lambda: model.fit(data, shuffle=False, verbose=0)


@pytest.mark.parametrize("clipping", list(CLIPPING))
def test_fit_clips_the_global_gradient(clipping):
    model, fit = _replicated(clipping)
    fit()
    assert _difference(_weights(model), _one_device(clipping)) < TOLERANCE


def test_without_the_fix_each_replica_clips_its_own_gradient():
    model, fit = _replicated("clipnorm")
    for fix in gradient_clipping.FIXES:
        fix.uninstall()
    try:
        fit()
    finally:
        for fix in gradient_clipping.FIXES:
            fix.install()
    assert _difference(_weights(model), _one_device("clipnorm")) > 1e-3


def test_loss_scale_optimizer_unscales_then_clips_the_global_gradient():
    # Mixed precision's LossScaleOptimizer: the inner optimizer gets unscaled gradients
    # and clips their all-reduced sum, as on one device.
    model, fit = _replicated("global_clipnorm", loss_scale=True)
    fit()
    reference = _one_device("global_clipnorm", loss_scale=True)
    assert _difference(_weights(model), reference) < TOLERANCE


def train_from_scratch(strategy, model, x, y):
    """keras.io's training loop from scratch under `strategy`, one pass over (x, y)."""
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH)
    loss_fn = keras.losses.MeanSquaredError(reduction=None)

    @tf.function
    def step(batch):
        def replica_step(inputs, targets):
            with tf.GradientTape() as tape:
                losses = loss_fn(targets, model(inputs, training=True))
                loss = tf.nn.compute_average_loss(losses, global_batch_size=GLOBAL_BATCH)
            grads = tape.gradient(loss, model.trainable_weights)
            model.optimizer.apply_gradients(zip(grads, model.trainable_weights))
        strategy.run(replica_step, args=batch)

    for batch in strategy.experimental_distribute_dataset(dataset):
        step(batch)


def test_a_loop_from_scratch_clips_the_global_gradient():
    strategy = sk.mirrored(cpu_devices(4))
    with strategy.scope():
        model = _regressor("clipvalue")
    train_from_scratch(strategy, model, *_data())
    assert _difference(_weights(model), _one_device("clipvalue")) < TOLERANCE


_WORKER = """
import json
import strategykit as sk
from test_gradient_clipping import GLOBAL_BATCH, _data, _regressor, _weights
strategy = sk.from_env()
with strategy.scope():
    model = _regressor("global_clipnorm")
model.fit(sk.shard(_data(), strategy, global_batch_size=GLOBAL_BATCH), shuffle=False, verbose=0)
print(json.dumps({"replicas": strategy.num_replicas_in_sync,
                  "weights": [w.tolist() for w in _weights(model)]}))
"""


def test_two_worker_processes_clip_the_global_gradient(tmp_path):
    finished = run_workers(_WORKER, 2, tmp_path=tmp_path, timeout=180)
    reference = _one_device("global_clipnorm")
    for worker in finished:
        report = worker.last_json()
        assert report["replicas"] == 2
        assert _difference(report["weights"], reference) < TOLERANCE
