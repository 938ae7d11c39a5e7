import keras
import numpy as np
import pytest

from strategykit.equivalence import weight_differences as differ


def nested_model():
    inner = keras.Sequential([keras.Input((2,)), keras.layers.Dense(2, name="b"),
                              keras.layers.BatchNormalization(name="c")], name="inner")
    return keras.Sequential([keras.Input((2,)), keras.layers.Dense(2, name="a"), inner,
                             keras.layers.ReLU(name="d")])


def test_layers_in_forward_order_with_nested_models_in_place():
    names = [name for name, _ in differ.flat_layers(nested_model())]
    assert names == ["a", "inner/b", "inner/c", "d"]


def differences(model, **by_weight):
    """One difference per weight of `model`: `a_kernel=1.0`, every other one 0."""
    return [by_weight.get("_".join(w.path.split("/")[-2:]), 0.0) for w in model.weights]


def test_forward_state_names_the_layer_before_trainable_weights():
    model = nested_model()
    after_one = differences(model, a_kernel=1.0, c_moving_mean=1.0)
    assert differ.start(model, after_one, after_one, 1e-5) == ("inner/c", differ.FORWARD)
    after_one = differences(model, b_kernel=1.0)
    assert differ.start(model, after_one, after_one, 1e-5) == ("inner/b", differ.GRADIENTS)


def test_without_the_first_update_the_first_layer_that_differs_at_the_end():
    model = nested_model()
    final = differences(model, b_bias=1.0, c_gamma=1.0)
    assert differ.start(model, None, final, 1e-5) == ("inner/b", differ.LATER)
    assert differ.start(model, None, differences(model), 1e-5) == (None, None)


def test_largest_differences_and_different_models():
    assert differ.largest([np.ones(3)], [np.array([1.0, 3.0, 0.5])]) == [2.0]
    with pytest.raises(ValueError, match=r"model_fn built two different models: 1 weights "
                       r"on one device, 2 in the strategy's scope"):
        differ.largest([np.ones(3)], [np.ones(3), np.ones(2)])
