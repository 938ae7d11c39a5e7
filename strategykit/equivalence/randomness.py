"""The random layers of a model, switched off for `sk.check`.

Dropout, noise and augmentation layers draw new random numbers on every step, and N
replicas draw other numbers than one device (each replica its own stream), so two
correct runs of a model with them never end with equal weights. `sk.check` compares the
arithmetic of distribution instead: it runs those layers as in inference (Dropout and
noise pass their inputs through, augmentation layers do what they do at inference, which
draws nothing) on both sides, and names them in its report.

A random layer is one holding a `keras.random.SeedGenerator`, as every random layer of
Keras does (Dropout, SpatialDropout, GaussianDropout, AlphaDropout, GaussianNoise, the
`Random*` augmentation layers), and as your own should: random ops without one (e.g.
`tf.random.uniform` in a `call`) are not found.
"""

from __future__ import annotations

import functools
import inspect

import keras

from strategykit.batchnorm.nested_layers import every_layer


def random_layers(model: keras.Model) -> dict:
    """The random layers of `model`, inside nested models and layers too.

    Returns:
        `{name: class name}` in forward order; nested layers are named `"outer/inner"`.

    Example:
        >>> import keras
        >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4),
        ...                           keras.layers.Dropout(0.5, name="drop")])
        >>> random_layers(model)
        {'drop': 'Dropout'}
    """
    return {name: type(layer).__name__ for name, layer in _random(model)}


def switch_off(model: keras.Model) -> dict:
    """Makes every random layer of `model` compute as in inference, also in training.

    Call it before `model` is traced (before `fit()`): the layers' `call` is replaced on
    these layer objects only (their class, and every other model, are left alone).

    Raises:
        ValueError: a random layer whose `call` takes no `training` argument (it draws
            in every call, keras.io's VAE `Sampling`): it cannot run as in inference.

    Returns:
        `random_layers(model)`: the layers switched off.

    Example:
        >>> import keras, numpy as np
        >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dropout(0.9)])
        >>> switch_off(model)
        {'dropout': 'Dropout'}
        >>> x = np.ones((2, 3), "float32")
        >>> bool((model(x, training=True).numpy() == x).all())
        True
    """
    found = list(_random(model))
    drawing = [name for name, layer in found if not _takes_training(layer.call)]
    if drawing:
        raise ValueError(
            f"sk.check cannot compare a model whose layer {drawing[0]!r} draws random "
            "numbers in every call: N replicas draw other numbers than one device, and "
            f"its call() takes no training argument, so it cannot run as in inference. "
            f"Received: {len(drawing)} such layer{'s' if len(drawing) > 1 else ''} "
            f"({', '.join(drawing[:3])}). Give its call() a training argument and draw "
            "only when training (e.g. keras.io's Sampling: `def call(self, inputs, "
            "training=None)` returning z_mean when not training); sk.check then runs it "
            "as in inference on both sides."
        )
    for _, layer in found:
        if not getattr(layer.call, "_strategykit_inference", False):
            layer.call = _in_inference(layer.call)
    return {name: type(layer).__name__ for name, layer in found}


def _takes_training(call) -> bool:
    """Whether a layer's `call` accepts `training` (by name, or through `**kwargs`)."""
    try:
        parameters = inspect.signature(call).parameters.values()
    except (TypeError, ValueError):  # no signature to read: as Keras, pass it
        return True
    return any(p.name == "training" or p.kind is p.VAR_KEYWORD for p in parameters)


def _in_inference(call):
    @functools.wraps(call)
    def inference_call(*args, **kwargs):
        kwargs["training"] = False
        return call(*args, **kwargs)

    inference_call._strategykit_inference = True
    return inference_call


def _random(model: keras.Model):
    """`(name, layer)` of each random layer, in forward order."""
    for name, layer in every_layer(model):
        if any(isinstance(value, keras.random.SeedGenerator) for value in vars(layer).values()):
            yield name, layer
