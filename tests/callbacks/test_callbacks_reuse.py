"""CrossReplicaLoss keeps its hooked steps with the model: fit() again traces nothing again.

A trace takes seconds for a large model, and notebooks call fit() over and over, each
time with a new callback. Python code in a step runs only while the step is traced, so
a model that counts its `train_step` and `test_step` calls counts traces.
"""

import collections

import keras
import numpy as np
import pytest

from strategykit import callbacks

from conftest import ZeroSubclassed

traces = collections.Counter()


class TraceCounting(ZeroSubclassed):
    """y = w x with w = 0 at first; counts how often its steps are traced."""
    def train_step(self, data):
        traces["train"] += 1
        return super().train_step(data)

    def test_step(self, data):
        traces["test"] += 1
        return super().test_step(data)


def data():
    """Replica 0 (of 2) sees y = 1, 2, 5, 6 and replica 1 sees y = 3, 4, 7, 8."""
    y = np.arange(1, 9, dtype="float32")[:, None]
    return np.ones_like(y), y


def fit(model, *cbs, validation=True):
    x, y = data()
    return model.fit(x, y, batch_size=4, epochs=1, verbose=0, shuffle=False,
                     validation_data=(x, y) if validation else None,
                     callbacks=list(cbs)).history


@pytest.fixture
def model(make_strategy):
    traces.clear()
    with make_strategy(2).scope():
        model = TraceCounting()
        model.compile(keras.optimizers.SGD(0.0), "mse")
    return model


def test_fit_again_with_a_new_callback_traces_nothing_again(model):
    first = fit(model, callbacks.CrossReplicaLoss())
    traced = dict(traces)
    assert traced["train"] > 0 and traced["test"] > 0
    second = fit(model, callbacks.CrossReplicaLoss())
    assert dict(traces) == traced
    for history in (first, second):  # the reused accumulators start from zero again
        assert history["loss/replica_0"] == pytest.approx([np.mean([1, 4, 25, 36])])
        assert history["loss/replica_1"] == pytest.approx([np.mean([9, 16, 49, 64])])
        assert history["val_loss/mean"] == pytest.approx([np.mean(data()[1] ** 2)])


def test_the_models_own_functions_come_back_traced(model):
    fit(model)  # the model's own functions, traced
    own = model.train_function, model.test_function
    traced = dict(traces)
    fit(model, callbacks.CrossReplicaLoss())
    assert (model.train_function, model.test_function) == own
    after_hooked = dict(traces)
    fit(model)
    model.evaluate(*data(), batch_size=4, verbose=0)
    assert dict(traces) == after_hooked != traced


def test_each_nan_policy_keeps_its_own_train_function(model):
    fit(model, callbacks.CrossReplicaLoss(), validation=False)  # with the weight snapshot
    fit(model, callbacks.CrossReplicaLoss(on_nan="ignore"), validation=False)  # without
    traced = dict(traces)
    fit(model, callbacks.CrossReplicaLoss(), validation=False)
    history = fit(model, callbacks.CrossReplicaLoss(on_nan="ignore"), validation=False)
    assert dict(traces) == traced
    assert history["loss/replica_1"] == pytest.approx([np.mean([9, 16, 49, 64])])


def test_standalone_evaluate_reuses_the_fits_test_function(model):
    fit(model, callbacks.CrossReplicaLoss())
    traced = dict(traces)
    recorder = callbacks.CrossReplicaLoss(reductions=("max",))
    result = model.evaluate(*data(), batch_size=4, verbose=0, return_dict=True,
                            callbacks=[recorder])
    assert dict(traces) == traced
    assert result == {"loss": pytest.approx(np.mean(data()[1] ** 2))}


@pytest.mark.parametrize("optimizer", ["same", "new"])
def test_compile_again_hooks_the_new_loss(model, optimizer):
    fit(model, callbacks.CrossReplicaLoss())
    with model.distribute_strategy.scope():
        model.compile(model.optimizer if optimizer == "same" else keras.optimizers.SGD(0.0),
                      "mae")
    history = fit(model, callbacks.CrossReplicaLoss())
    assert history["loss/replica_0"] == pytest.approx([np.mean([1, 2, 5, 6])])
    assert history["val_loss/replica_1"] == pytest.approx([np.mean([3, 4, 7, 8])])
