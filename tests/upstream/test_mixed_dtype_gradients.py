"""Gradients of several dtypes under several replicas: reduced one dtype at a time.

A float64 model can hold float32 variables: Keras makes the LoRA kernels of
`enable_lora` float32 whatever the policy, and a user may give one layer
`dtype="float32"`. TensorFlow's collective all-reduce concatenates the list of gradients
Keras hands it into one tensor, and failed on 4 replicas with `TypeError: Tensors in
list passed to 'values' of 'ConcatV2' Op have types [float32, ..., float64]`
(`strategykit.upstream.sparse_gradients` reduces each dtype apart). Each replica gets
different examples; the final batch is partial (21 examples, batches of 8).
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import strategykit as sk
from strategykit.upstream import sparse_gradients

from conftest import assert_same_as_one_device, cpu_devices, reference_runs_eagerly

GLOBAL_BATCH = 8


def _regressor():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((3,)),
        keras.layers.Dense(4, activation="tanh"),
        keras.layers.Dense(4, activation="tanh", dtype="float32"),  # float32 in float64
        keras.layers.Dense(1),
    ])
    model.compile(keras.optimizers.Adam(0.05), "mse", run_eagerly=reference_runs_eagerly())
    return model


def _data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(21, 3)), rng.normal(size=(21, 1))


def _trained(strategy, sharded: bool):
    with strategy.scope():
        model = _regressor()
    x, y = _data()
    if sharded:
        history = model.fit(sk.shard((x, y), strategy, global_batch_size=GLOBAL_BATCH),
                            epochs=2, verbose=0).history
    else:
        history = model.fit(x, y, batch_size=GLOBAL_BATCH, shuffle=False, epochs=2,
                            verbose=0).history
    return model, history


def test_a_float64_model_with_a_float32_layer_trains_on_four_replicas_as_one_device(float64):
    one, one_history = _trained(tf.distribute.get_strategy(), sharded=False)
    model, history = _trained(sk.mirrored(cpu_devices(4)), sharded=True)
    assert {weight.dtype for weight in model.weights} == {"float32", "float64"}
    # the float32 layer's own rounding: each replica's gradient is rounded to float32
    # before the sum, one device's once
    assert_same_as_one_device(model, one, history, one_history, atol=1e-6, rtol=1e-6)


def test_without_the_fix_mixed_dtypes_fail_in_the_all_reduce(float64, monkeypatch):
    monkeypatch.setattr(sparse_gradients, "_each_dtype_apart", lambda reduce: reduce)
    with pytest.raises(TypeError, match="ConcatV2"):
        _trained(sk.mirrored(cpu_devices(4)), sharded=True)
