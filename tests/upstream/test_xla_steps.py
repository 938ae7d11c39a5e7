"""XLA (`jit_compile`) on several replicas trains as one device does with XLA.

Keras compiles its whole step, `strategy.run` included, and fails at the first step on
several replicas ("Trying to access resource .../replica_1 located in device CPU:1 from
device CPU:0"): every test here fails on Keras alone. strategykit compiles each
replica's own computation (`strategykit.xla.replica_steps`). 37 examples, global batch
16 (a padded final batch of 5: 3 and 2 examples on 2 replicas), float64, against one
device with `jit_compile=True` on the same global batches: every weight, every number
fit() and evaluate() report, and predict()'s rows.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import strategykit as sk
from strategykit.xla import replica_steps as xla_steps

from conftest import assert_same_as_one_device, cpu_devices
from workers import run_workers

EXAMPLES, GLOBAL_BATCH = 37, 16


def _conv_net(sync_bn: bool, steps_per_execution: int = 1, jit_compile=True, metrics=True):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((6, 6, 2)),
        keras.layers.Conv2D(4, 3, activation="relu"),
        sk.SyncBatchNormalization() if sync_bn else keras.layers.Identity(),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(3),
    ])
    model.compile(keras.optimizers.Adam(1e-2, global_clipnorm=0.5),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  weighted_metrics=["accuracy"] if metrics else None, jit_compile=jit_compile,
                  steps_per_execution=steps_per_execution)
    return model


def _data():
    rng = np.random.default_rng(3)
    return rng.normal(size=(EXAMPLES, 6, 6, 2)), rng.integers(0, 3, EXAMPLES)


@pytest.mark.slow
def test_xla_on_two_replicas_equals_xla_on_one_device(float64):
    # Synchronized batch norm and steps_per_execution=2 (the K = 1 step: the two-worker
    # test below); fit(), evaluate() and predict()
    x, y = _data()
    one = _conv_net(sync_bn=True, steps_per_execution=2)
    one_history = one.fit(x, y, batch_size=GLOBAL_BATCH, epochs=1, shuffle=False,
                          verbose=0).history
    one_scores = one.evaluate(x, y, batch_size=GLOBAL_BATCH, verbose=0, return_dict=True)
    strategy = sk.mirrored(cpu_devices(2))
    with strategy.scope():
        model = _conv_net(sync_bn=True, steps_per_execution=2)
    assert model.jit_compile is True and xla_steps.compiles_each_replica(model)
    train = sk.shard((x, y), strategy, global_batch_size=GLOBAL_BATCH)
    history = model.fit(train, epochs=1, verbose=0).history
    scores = model.evaluate(train, verbose=0, return_dict=True)
    assert_same_as_one_device(model, one, history, one_history)
    assert_same_as_one_device(model, one, scores, one_scores)
    # predict() compiles per replica in Keras already; rows in order
    predictions = model.predict(sk.shard(x, strategy, global_batch_size=GLOBAL_BATCH),
                                verbose=0)
    np.testing.assert_allclose(predictions, one.predict(x, batch_size=GLOBAL_BATCH,
                                                        verbose=0), atol=1e-12)


def test_each_replica_runs_compiled_clusters_and_the_all_reduce_stays_out(float64):
    strategy = sk.mirrored(cpu_devices(2))
    with strategy.scope():
        model = _conv_net(sync_bn=True, metrics=False)
        model.optimizer.build(model.trainable_variables)
    marked, unmarked = [], []

    def step(data):
        graph = tf.compat.v1.get_default_graph()
        before = len(graph.get_operations())
        outputs = model.train_step(data)
        for op in graph.get_operations()[before:]:
            try:
                (marked if op.get_attr("_XlaCompile") else unmarked).append(op.type)
            except ValueError:
                unmarked.append(op.type)
        return outputs

    compiled = xla_steps.compiling_each_replica(step)
    data = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices(_data()).batch(GLOBAL_BATCH))
    tf.function(lambda batch: strategy.run(compiled, args=(batch,))).get_concrete_function(
        next(iter(data)))  # traced, not run
    assert {"Conv2D", "Conv2DBackpropFilter", "MatMul"} <= set(marked)
    assert not [name for name in marked if name.startswith(("Collective", "Nccl"))]
    # Adam's update of every copy runs in the merge_call, outside XLA
    assert "AssignSubVariableOp" in unmarked and "AssignSubVariableOp" not in marked


def test_auto_turns_xla_on_where_keras_does_for_one_device(monkeypatch):
    strategy = sk.mirrored(cpu_devices(2))
    with strategy.scope():
        on_cpu = _conv_net(sync_bn=True, jit_compile="auto")
    assert on_cpu.jit_compile is False  # no GPU: off, as on one device
    gpu = tf.config.PhysicalDevice(name="/physical_device:GPU:0", device_type="GPU")
    physical = tf.config.list_physical_devices()
    monkeypatch.setattr(tf.config, "list_physical_devices",
                        lambda device_type=None: [*physical, gpu])
    with strategy.scope():
        on_gpus = _conv_net(sync_bn=True, jit_compile="auto")
    assert on_gpus.jit_compile is True  # Keras alone: False under every strategy
    assert xla_steps.compiles_each_replica(on_gpus)


_TWO_WORKERS = """
import json
import keras, numpy as np
import strategykit as sk
from test_xla_steps import GLOBAL_BATCH, _conv_net, _data

strategy = sk.from_env()
keras.config.set_floatx("float64")
keras.config.set_dtype_policy("float64")
with strategy.scope():
    model = _conv_net(sync_bn=True)
history = model.fit(sk.shard(_data(), strategy, global_batch_size=GLOBAL_BATCH), epochs=1,
                    verbose=0).history
print(json.dumps({"jit_compile": model.jit_compile, "history": history,
                  "weights": [w.tolist() for w in model.get_weights()]}))
"""


@pytest.mark.slow
def test_xla_across_two_workers_equals_xla_on_one_device(float64, tmp_path):
    x, y = _data()
    one = _conv_net(sync_bn=True)
    one_history = one.fit(x, y, batch_size=GLOBAL_BATCH, epochs=1, shuffle=False,
                          verbose=0).history
    for worker in run_workers(_TWO_WORKERS, 2, tmp_path=tmp_path):
        report = worker.last_json()
        assert report["jit_compile"] is True
        for name, values in one_history.items():
            np.testing.assert_allclose(report["history"][name], values, rtol=1e-10)
        for weight, expected in zip(report["weights"], one.get_weights(), strict=True):
            np.testing.assert_allclose(weight, expected, rtol=0, atol=1e-10)
