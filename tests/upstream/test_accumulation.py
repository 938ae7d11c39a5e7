"""Keras's own `gradient_accumulation_steps` under strategykit's strategies (keras#20582).

N replicas x K micro-batches of B examples must train like one device on the N x K x B
examples of each window, and exactly like Keras's own accumulation on one device with
micro-batches of N x B. The data is random, so every replica gets different examples
and the tests fail when the cross-replica reduction is removed.
"""

import contextlib
import functools

import keras
import numpy as np
import pytest
import tensorflow as tf

import strategykit as sk
from strategykit import upstream

from conftest import cpu_devices, restorer
from workers import run_workers

K = 4  # micro-steps per update
B = 2  # examples per replica and micro-step
TOLERANCE = 1e-5

OPTIMIZERS = {
    "sgd_momentum": lambda steps=None: keras.optimizers.SGD(
        0.05, momentum=0.9, gradient_accumulation_steps=steps),
    "adam": lambda steps=None: keras.optimizers.Adam(0.01, gradient_accumulation_steps=steps),
    "adamw": lambda steps=None: keras.optimizers.AdamW(
        0.01, weight_decay=0.1, gradient_accumulation_steps=steps),
    "sgd_with_options": lambda steps=None: keras.optimizers.SGD(
        keras.optimizers.schedules.ExponentialDecay(0.1, 3, 0.5), momentum=0.9,
        global_clipnorm=0.5, use_ema=True, gradient_accumulation_steps=steps),
}


def _data(examples: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(examples, 3)).astype("float32")
    y = x @ np.array([[1.0], [-2.0], [0.5]], "float32") + rng.normal(size=(examples, 1))
    return x, y.astype("float32")


def _regressor(optimizer: str, steps=None, normalization=None):
    """A compiled small regressor, same initial weights every time; `optimizer` names one
    of `OPTIMIZERS`, made with `gradient_accumulation_steps=steps` (in the current scope)."""
    keras.utils.set_random_seed(0)
    layers = [keras.Input((3,)), keras.layers.Dense(8, activation="tanh")]
    if normalization is not None:
        layers.append(normalization())
    model = keras.Sequential([*layers, keras.layers.Dense(1)])
    model.compile(OPTIMIZERS[optimizer](steps), "mse")
    return model


def _difference(model, reference) -> float:
    return max(float(np.abs(a - b).max())
               for a, b in zip(model.get_weights(), reference.get_weights()))


def _fit_replicated(strategy, optimizer, steps, data, normalization=None, **fit_kwargs):
    with strategy.scope():
        model = _regressor(optimizer, steps, normalization)
    model.fit(*data, shuffle=False, verbose=0, **fit_kwargs)
    return model


def _fit_one_device(optimizer, steps, data, normalization=None, **fit_kwargs):
    model = _regressor(optimizer, steps, normalization)
    model.fit(*data, shuffle=False, verbose=0, **fit_kwargs)
    return model


@functools.cache
def _shared(optimizer, replicas=None):
    """A `restorer` of a model of `_regressor(optimizer, K)` on `replicas` replicas (one
    device when None; its optimizer's accumulators and micro-step count included). Built
    and traced once per test process: several tests fit the same one on batches of the
    same shape, each from its initial state (`_fresh`)."""
    with sk.mirrored(cpu_devices(replicas)).scope() if replicas else contextlib.nullcontext():
        model = _regressor(optimizer, K)
        model.optimizer.build(model.trainable_variables)
    return restorer(model)


def _fresh(optimizer, replicas=None):
    """`_shared(optimizer, replicas)` reset to its initial state, as a new model would be."""
    return _shared(optimizer, replicas)()


@functools.cache
def _one_device_on_the_accumulated_batch(optimizer, replicas):
    """One device, 2 epochs on `_data(replicas * K * B * 3)` in batches of the K
    micro-batches of `replicas` replicas together. Trained once per test process: several
    tests compare with it (they read it, never train it further)."""
    return _fit_one_device(optimizer, None, _data(replicas * K * B * 3),
                           batch_size=replicas * K * B, epochs=2)


def train_in_custom_loop(strategy, model, data, global_batch_size, options=None):
    """Two epochs of `strategy.run(step)` with `optimizer.apply_gradients`, as users write.

    `model` was made in `strategy.scope()`; `options` are `tf.data.Options` for the data.
    """
    optimizer = model.optimizer
    with strategy.scope():
        optimizer.build(model.trainable_variables)
    dataset = tf.data.Dataset.from_tensor_slices(data).batch(global_batch_size)
    batches = strategy.experimental_distribute_dataset(
        dataset if options is None else dataset.with_options(options))

    def replica_step(x, y):
        with tf.GradientTape() as tape:
            per_example = keras.losses.mean_squared_error(y, model(x, training=True))
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch_size)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))

    step = tf.function(lambda batch: strategy.run(replica_step, args=batch))
    for _ in range(2):
        for batch in batches:
            step(batch)


def test_keras_fails_without_the_fix(make_strategy):
    strategy = make_strategy(2)  # installs the fixes; remove them again
    upstream.uninstall()
    try:
        with pytest.raises(RuntimeError, match="merge_call` called while defining a new graph"):
            _fit_replicated(strategy, "sgd_momentum", K, _data(16), batch_size=4)
    finally:
        upstream.install()


def test_keras_optimizer_inherits_the_replaced_method():
    # The fix gives Keras's TF optimizer class its own `_backend_apply_gradients`; it was
    # checked on a Keras whose class inherits BaseOptimizer's. If upstream defines one
    # there, re-check the fix (tests/upstream/test_upstream.py pins the code it relies on).
    fix = upstream.accumulation.FIXES[0]
    upstream.uninstall()
    try:
        assert fix.attribute not in vars(fix.owner_class())
    finally:
        upstream.install()


# Every optimizer on 2 replicas, and on 4 the one with the most state (AdamW: Adam's
# moments and weight decay): the replicas' reduction is the same code for every optimizer,
# and each optimizer's accumulation the same code for any number of replicas.
@pytest.mark.parametrize("name, replicas", [("sgd_momentum", 2), ("adam", 2), ("adamw", 2),
                                            ("adamw", 4)])
def test_fit_equals_one_device_on_the_accumulated_batch(name, replicas):
    data = _data(replicas * K * B * 3)  # 3 updates per epoch
    model, keras_accumulation = _fresh(name, replicas), _fresh(name)
    for trained in (model, keras_accumulation):
        trained.fit(*data, batch_size=replicas * B, epochs=2, shuffle=False, verbose=0)
    large_batch = _one_device_on_the_accumulated_batch(name, replicas)
    assert _difference(large_batch, _regressor(name, None)) > 0.01  # it trained
    assert _difference(model, large_batch) < TOLERANCE
    assert _difference(model, keras_accumulation) < TOLERANCE
    assert int(model.optimizer.iterations) == int(large_batch.optimizer.iterations) == 6


def test_schedule_clipping_and_ema_as_keras_on_one_device(make_strategy):
    # Keras's schedules see micro-steps, clipping applies to the window's mean gradient,
    # EMA follows every micro-step: the same under a strategy.
    data = _data(2 * K * B * 3)
    kwargs = {"batch_size": 2 * B, "epochs": 2}
    model = _fit_replicated(make_strategy(2), "sgd_with_options", K, data, **kwargs)
    keras_accumulation = _fit_one_device("sgd_with_options", K, data, **kwargs)
    assert _difference(model, keras_accumulation) < TOLERANCE
    state = [np.abs(a.numpy() - b.numpy()).max() for a, b in zip(
        model.optimizer.variables, keras_accumulation.optimizer.variables)]
    assert max(state) < TOLERANCE  # optimizer state, EMA included


def _fit_counting_updates(model, data, **fit_kwargs) -> list[int]:
    counts = []
    count = keras.callbacks.LambdaCallback(
        on_epoch_end=lambda epoch, logs: counts.append(int(model.optimizer.iterations)))
    model.fit(*data, shuffle=False, verbose=0, callbacks=[count], **fit_kwargs)
    return counts


def test_iterations_count_updates_across_epochs():
    # 6 micro-steps per epoch: the second window spans the two epochs, as in Keras.
    data, kwargs = _data(2 * B * 6), {"batch_size": 2 * B, "epochs": 2}
    model, reference = _fresh("adam", 2), _fresh("adam")  # as the test above fits them
    assert _fit_counting_updates(model, data, **kwargs) == [1, 3]
    assert _fit_counting_updates(reference, data, **kwargs) == [1, 3]
    assert _difference(model, reference) < TOLERANCE


def test_padded_final_batch_counts_as_one_micro_step(make_strategy):
    # 30 examples, global micro-batch 4: 7 full micro-steps and a final one of 2 real
    # examples, padded by sk.shard. It weighs 1/K of its window like any micro-step, as
    # in Keras's own accumulation on one device (whose final batch has 2 examples).
    strategy = make_strategy(2)
    data = _data(30)
    loss = sk.callbacks.CrossReplicaLoss()
    with strategy.scope():
        model = _regressor("sgd_momentum", K)
    model.fit(sk.shard(data, strategy, global_batch_size=2 * B), epochs=2, shuffle=False,
              verbose=0, callbacks=[loss])
    keras_accumulation = _fresh("sgd_momentum")
    keras_accumulation.fit(*data, batch_size=2 * B, epochs=2, shuffle=False, verbose=0)
    large_batch = _fit_one_device("sgd_momentum", None, data, batch_size=2 * K * B,
                                  epochs=2)
    assert _difference(model, keras_accumulation) < TOLERANCE
    assert _difference(model, large_batch) > 1e-3  # examples of a window weigh unequally
    assert int(model.optimizer.iterations) == 4
    # CrossReplicaLoss sees every micro-step: its mean is over every real example.
    np.testing.assert_allclose(model.history.history["loss/mean"],
                               keras_accumulation.history.history["loss"], rtol=1e-5)


def test_custom_loop(make_strategy):
    replicas = 2
    strategy = make_strategy(replicas)
    data = _data(replicas * K * B * 3)
    with strategy.scope():
        model = _regressor("adam", K)
    train_in_custom_loop(strategy, model, data, replicas * B)
    large_batch = _one_device_on_the_accumulated_batch("adam", replicas)
    assert _difference(model, large_batch) < TOLERANCE
    assert int(model.optimizer.iterations) == 6


_WORKER = """
import json
import tensorflow as tf
import strategykit as sk
from test_accumulation import B, K, _data, _regressor, train_in_custom_loop
strategy = sk.from_env()
with strategy.scope():
    model = _regressor("adam", K)
options = tf.data.Options()
options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
train_in_custom_loop(strategy, model, _data(2 * K * B * 3), 2 * B, options)
print(json.dumps({"strategy": type(strategy).__name__,
                  "updates": int(model.optimizer.iterations),
                  "weights": [w.tolist() for w in model.get_weights()]}))
"""


def test_custom_loop_across_two_worker_processes(tmp_path):
    # sk.from_env(): MultiWorkerMirroredStrategy, one replica per worker process.
    finished = run_workers(_WORKER, 2, tmp_path=tmp_path, timeout=180)
    large_batch = _one_device_on_the_accumulated_batch("adam", 2)
    for worker in finished:
        report = worker.last_json()
        assert report["strategy"] == "CollectiveAllReduceStrategy"
        assert report["updates"] == 6
        difference = max(float(np.abs(np.array(w) - r).max())
                         for w, r in zip(report["weights"], large_batch.get_weights()))
        assert difference < TOLERANCE


def test_sync_batch_norm_sees_each_global_micro_batch(make_strategy):
    # Batch norm normalizes each micro-batch: with sk.SyncBatchNormalization N replicas
    # equal Keras's accumulation on one device with micro-batches of N x B (moving
    # statistics included); per-replica batch norm (moments of B examples) does not.
    data = _data(2 * K * B * 2)
    kwargs = {"batch_size": 2 * B, "epochs": 1}
    synchronized = _fit_replicated(make_strategy(2), "sgd_momentum", K, data,
                                   sk.SyncBatchNormalization, **kwargs)
    local = _fit_replicated(make_strategy(2), "sgd_momentum", K, data,
                            keras.layers.BatchNormalization, **kwargs)
    reference = _fit_one_device("sgd_momentum", K, data, keras.layers.BatchNormalization,
                                **kwargs)
    assert _difference(synchronized, reference) < TOLERANCE
    assert _difference(local, reference) > 1e-3
