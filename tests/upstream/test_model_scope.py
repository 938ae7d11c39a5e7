"""A model and sk.shard data of different strategies: one clear error before any step."""

import keras
import numpy as np
import pytest

import strategykit as sk

from conftest import cpu_devices


def _model():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    return model


def _data():
    x = np.random.default_rng(0).normal(size=(20, 3)).astype("float32")
    return x, x.sum(axis=1)


@pytest.mark.parametrize("call", ["fit", "evaluate", "predict"])
def test_a_model_built_outside_the_scope_is_refused_naming_the_scope(call):
    strategy = sk.mirrored(cpu_devices(2))
    model = _model()  # outside strategy.scope()
    data = sk.shard(_data(), strategy, global_batch_size=8)
    words = "fit\\(\\) or evaluate\\(\\)" if call != "predict" else "predict\\(\\)"
    with pytest.raises(ValueError, match=(
            rf"model\.{words} was given data that sk.shard made for a MirroredStrategy of 2 "
            r"replicas, but the model 'sequential(_\d+)?' was built outside any strategy's "
            r"scope\. Received: a model whose variables, e\.g\. '.*', were not created in "
            r"that strategy's scope\. Build and compile the model inside `with "
            r"strategy\.scope\(\):`")):
        getattr(model, call)(data, verbose=0)
    assert model.optimizer.iterations.numpy() == 0  # no step ran


def test_a_model_of_another_strategy_is_refused():
    built_in, sharded_for = sk.mirrored(cpu_devices(2)), sk.mirrored(cpu_devices(4))
    with built_in.scope():
        model = _model()
    with pytest.raises(ValueError, match=r"MirroredStrategy of 4 replicas, but the model "
                                         r"'.*' was built in the scope of another strategy"):
        model.fit(sk.shard(_data(), sharded_for, global_batch_size=8), verbose=0)


def test_a_model_of_the_data_strategy_trains():
    strategy = sk.mirrored(cpu_devices(2))
    with strategy.scope():
        model = _model()
    model.fit(sk.shard(_data(), strategy, global_batch_size=8), verbose=0)
    assert model.optimizer.iterations.numpy() == 3
