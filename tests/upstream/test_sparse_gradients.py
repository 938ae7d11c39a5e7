"""Sparse gradients under several replicas: every stateful Keras optimizer as one device.

keras.io's Transformer text classifier embeds tokens (a lookup per example) and positions
(`Embedding(maxlen, d)(ops.arange(maxlen))`, the same lookup for every example). Its
position table's gradient is one slice per position on one device; concatenated across
replicas it was N slices per position, and every optimizer that squares its gradient
(Adam, RMSprop, ...) drifted from one device (`strategykit.upstream.sparse_gradients`).
Each replica gets different tokens and labels, so summing the wrong slices shows. The
one-device reference runs eagerly (the same computation, without tracing it).
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import strategykit as sk
from strategykit.upstream import sparse_gradients

from conftest import cpu_devices, reference_runs_eagerly

MAXLEN, VOCABULARY, WIDTH = 6, 11, 4
TOLERANCE = {"float64": 1e-12, "float32": 1e-5}
GLOBAL_BATCH = 16

STATEFUL = ["Adadelta", "Adafactor", "Adagrad", "Adam", "AdamW", "Adamax", "Ftrl", "Lamb",
            "Lion", "Muon", "Nadam", "RMSprop"]
"""Every built-in optimizer that keeps state (Muon from Keras 3.10, usable on TensorFlow
from 3.13; SGD is linear in the gradient and was exact). Not ScheduleFreeAdamW (Keras
3.14): it differs from one device under a strategy with dense gradients too (it reads
its momentum after updating it)."""

DTYPES = {"Muon": "float32"}  # Keras's Muon multiplies by float32 constants


class TokenAndPositionEmbedding(keras.layers.Layer):
    """keras.io's text_classification_with_transformer layer."""

    def __init__(self, dtype="float64", **kwargs):
        super().__init__(dtype=dtype, **kwargs)
        self.token_emb = keras.layers.Embedding(VOCABULARY, WIDTH, dtype=dtype)
        self.pos_emb = keras.layers.Embedding(MAXLEN, WIDTH, dtype=dtype)

    def call(self, x):
        maxlen = keras.ops.shape(x)[-1]
        positions = self.pos_emb(keras.ops.arange(start=0, stop=maxlen, step=1))
        return self.token_emb(x) + positions


def _optimizer(name: str):
    cls = getattr(keras.optimizers, name, None)
    if cls is None:
        pytest.skip(f"keras.optimizers.{name} is not in Keras {keras.__version__}")
    if name == "Muon" and tuple(map(int, keras.__version__.split(".")[:2])) < (3, 13):
        pytest.skip("Keras's Muon before 3.13 reads variable.path of TensorFlow's "
                    "variables in its update step and fails on the TensorFlow backend")
    return cls(learning_rate=0.05)


def _classifier(optimizer: str):
    keras.utils.set_random_seed(0)
    dtype = DTYPES.get(optimizer, "float64")
    inputs = keras.Input((MAXLEN,), dtype="int32")
    x = TokenAndPositionEmbedding(dtype)(inputs)
    x = keras.layers.Dense(3, activation="tanh", dtype=dtype)(x)
    x = keras.layers.GlobalAveragePooling1D(dtype=dtype)(x)
    outputs = keras.layers.Dense(1, dtype=dtype)(x)
    model = keras.Model(inputs, outputs)
    model.compile(_optimizer(optimizer), "mse", run_eagerly=reference_runs_eagerly())
    return model


def _data(examples=2 * GLOBAL_BATCH):
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, VOCABULARY, (examples, MAXLEN)).astype("int32")
    return tokens, rng.normal(size=(examples, 1))


def _difference(model, reference) -> float:
    return max(float(np.abs(a - b).max())
               for a, b in zip(model.get_weights(), reference.get_weights(), strict=True))


def _one_device(optimizer, epochs=2):
    model = _classifier(optimizer)
    model.fit(*_data(), batch_size=GLOBAL_BATCH, epochs=epochs, shuffle=False, verbose=0)
    return model


def _replicated(optimizer, replicas=2, epochs=2):
    """The model and its fit: `fit()` trains it on `replicas` replicas."""
    strategy = sk.mirrored(cpu_devices(replicas))
    with strategy.scope():
        model = _classifier(optimizer)
    data = sk.shard(_data(), strategy, global_batch_size=GLOBAL_BATCH)
    return model, lambda: model.fit(data, epochs=epochs, shuffle=False, verbose=0)


@pytest.mark.parametrize("optimizer", STATEFUL)
def test_each_stateful_optimizer_trains_as_one_device(optimizer):
    model, fit = _replicated(optimizer)
    fit()
    tolerance = TOLERANCE[DTYPES.get(optimizer, "float64")]
    assert _difference(model, _one_device(optimizer)) < tolerance


def test_without_the_fix_adam_drifts_where_positions_are_shared():
    # What the test above would see without strategykit: the position table's slices
    # concatenated over the 2 replicas (raw tf.distribute does the same).
    model, fit = _replicated("Adam")
    fix, = sparse_gradients.FIXES
    fix.uninstall()
    try:
        fit()
    finally:
        fix.install()
    assert _difference(model, _one_device("Adam")) > 1e-4


def test_shared_indices_are_those_of_no_data():
    table = tf.Variable(tf.zeros((MAXLEN, WIDTH)))
    seen = {}

    @tf.function
    def step(tokens, length):
        with tf.GradientTape(persistent=True) as tape:
            positions = tf.gather(table, tf.range(MAXLEN))
            looked_up = tf.gather(table, tokens)
            by_length = tf.gather(table, tf.range(length))
        for name, value in [("positions", positions), ("tokens", looked_up),
                            ("dynamic length", by_length)]:
            seen[name] = sparse_gradients.shared_indices(
                tape.gradient(value, table).indices)
        seen["static shape"] = sparse_gradients.shared_indices(tf.shape(tokens))
        seen["dynamic shape"] = sparse_gradients.shared_indices(tf.shape(tokens[:length]))
        return 0

    step(tf.constant([1, 2]), tf.constant(3))
    assert seen == {"positions": True, "tokens": False, "dynamic length": False,
                    "static shape": True, "dynamic shape": False}
    assert not sparse_gradients.shared_indices(tf.range(3))  # eager: nothing to read
