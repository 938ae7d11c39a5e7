import keras
import numpy as np
import pytest
from conftest import bn_regressor, cpu_devices

import strategykit as sk


def dense_model():
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="tanh"),
                              keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.1), "mse")
    return model


def bn_model():
    return bn_regressor(seed=1)


def data(examples=48):
    # Every replica's slice of a global batch differs (rows grow with the index).
    x = np.linspace(-1.0, 3.0, examples * 3, dtype="float32").reshape(examples, 3)
    return x, x.sum(axis=1) ** 2


@pytest.mark.parametrize("replicas", [2, 4])
def test_a_dense_model_trains_identically_on_replicas_and_one_device(replicas):
    report = sk.check(dense_model, data(), strategy=sk.mirrored(cpu_devices(replicas)),
                      global_batch_size=8, steps=4)
    assert report.passed, str(report)
    assert report.replicas == replicas
    assert report.single_device_loss == pytest.approx(report.distributed_loss, rel=1e-5)
    assert "PASSED: " in str(report)


def test_unsynchronized_batch_norm_is_caught():
    report = sk.check(bn_model, data(), strategy=sk.mirrored(cpu_devices(2)),
                      global_batch_size=8, steps=4)
    assert not report.passed
    assert report.max_difference > 1e-3
    assert "FAILED" in str(report) and "sk.convert_sync_batchnorm" in str(report)


def test_replicas_default_to_a_strategy_built_by_mirrored():
    report = sk.check(dense_model, data(), replicas=2)
    assert report.replicas == 2 and report.global_batch_size == 8 and report.steps == 3


def test_the_batch_must_divide_over_the_replicas():
    with pytest.raises(ValueError, match=r"global_batch_size=6 does not divide evenly over 4 "
                       r"replicas\. Received: global_batch_size=6\. Use a multiple of 4"):
        sk.check(dense_model, data(), strategy=sk.mirrored(cpu_devices(4)), global_batch_size=6)


def test_too_little_data_for_the_steps_is_an_error():
    with pytest.raises(ValueError, match=r"holds 10 examples, fewer than steps x "
                       r"global_batch_size = 3 x 8"):
        sk.check(dense_model, data(10), replicas=2)


def test_model_fn_must_return_a_compiled_model():
    def uncompiled():
        return keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])

    with pytest.raises(ValueError, match=r"must return a compiled Keras model\. Received: "
                       r"Sequential \(not compiled\)"):
        sk.check(uncompiled, data(), replicas=2)
