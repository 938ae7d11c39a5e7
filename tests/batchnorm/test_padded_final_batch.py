"""Batch norm on sk.shard's padded final batch: the moments of the real examples only.

37 examples in global batches of 16 on 4 replicas: the final batch holds 5 real examples
(2, 1, 1, 1 per replica), each replica's batch filled up with copies. One device trains
on those 5 alone. Each example has its own offset, so a copy moves the moments.
"""

import functools

import keras
import numpy as np
import pytest

import strategykit as sk
from strategykit.batches import current_step

from conftest import cpu_devices

EXAMPLES, GLOBAL_BATCH = 37, 16

SYNCHRONIZED = {
    "ours": sk.SyncBatchNormalization,
    "keras_synchronized": functools.partial(keras.layers.BatchNormalization,
                                            synchronized=True),
}


def _conv_net(batch_norm):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((5, 5, 2)),
        keras.layers.Conv2D(3, 3, use_bias=False),
        batch_norm(momentum=0.5),
        keras.layers.ReLU(),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(3),
    ])
    model.compile(keras.optimizers.SGD(0.5),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _data():
    rng = np.random.default_rng(1)
    offsets = np.linspace(-3, 3, EXAMPLES)[:, None, None, None]
    return offsets + rng.normal(size=(EXAMPLES, 5, 5, 2)), rng.integers(0, 3, EXAMPLES)


def _one_device(batch_norm):
    model = _conv_net(batch_norm)
    model.fit(*_data(), batch_size=GLOBAL_BATCH, epochs=2, shuffle=False, verbose=0)
    return model


def _replicated(batch_norm, replicas=4):
    strategy = sk.mirrored(cpu_devices(replicas))
    with strategy.scope():
        model = _conv_net(batch_norm)
    model.fit(sk.shard(_data(), strategy, global_batch_size=GLOBAL_BATCH), epochs=2,
              verbose=0)
    return model


def _difference(model, reference) -> float:
    return max(float(np.abs(a - b).max())
               for a, b in zip(model.get_weights(), reference.get_weights(), strict=True))


@pytest.mark.parametrize("batch_norm", SYNCHRONIZED.values(), ids=SYNCHRONIZED.keys())
def test_synchronized_batch_norm_equals_one_device(batch_norm, float64):
    # weights, gamma, beta and the moving statistics, which a copy would move
    assert _difference(_replicated(batch_norm), _one_device(batch_norm)) < 1e-12


def test_without_the_real_examples_the_copies_move_the_statistics(monkeypatch, float64):
    monkeypatch.setattr(current_step, "current", lambda: None)
    layer = SYNCHRONIZED["ours"]
    assert _difference(_replicated(layer), _one_device(layer)) > 1e-4


@pytest.mark.parametrize("batch_norm", [keras.layers.BatchNormalization,
                                        sk.SyncBatchNormalization])
def test_one_replica_equals_one_device(batch_norm, float64):
    # sk.shard pads on one replica too: its 5 real examples are filled up to 16
    assert _difference(_replicated(batch_norm, replicas=1), _one_device(batch_norm)) < 1e-12
