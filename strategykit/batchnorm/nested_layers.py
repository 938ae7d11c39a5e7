"""Every layer of a model, nested ones too: inside nested models and custom layers.

`model.layers` lists a model's own layers: a nested Sequential or Functional model is
one entry, and a custom `Layer` that holds others (keras.io's residual blocks,
`TimeDistributed(BatchNormalization())`, a transformer block's norms) hides them. Both
`convert_sync_batchnorm` and `sk.check` must see every layer, so this module walks the
layers a layer holds in its attributes (alone, or in lists, tuples and dicts), each
layer once, named by its path (`"outer/inner"`).
"""

from __future__ import annotations

import keras


def flat_layers(model: keras.Model, prefix: str = ""):
    """`(name, layer)` in forward order, nested models' layers in place as `outer/inner`.

    The order is `model.layers`: graph order for Sequential and Functional models,
    creation order for subclassed ones.

    Example:
        >>> import keras
        >>> inner = keras.Sequential([keras.Input((2,)), keras.layers.Dense(2, name="d")],
        ...                          name="inner")
        >>> model = keras.Sequential([keras.Input((2,)), inner])
        >>> [name for name, _ in flat_layers(model)]
        ['inner/d']
    """
    for layer in model.layers:
        if isinstance(layer, keras.Model):
            yield from flat_layers(layer, f"{prefix}{layer.name}/")
        else:
            yield f"{prefix}{layer.name}", layer


def every_layer(model: keras.Model):
    """`(name, layer)` of `flat_layers(model)` and of every layer inside them (a custom
    layer's sublayers, held alone or in lists, tuples or dicts), as `outer/inner`, each
    layer once.

    Example:
        >>> import keras
        >>> wrapped = keras.layers.TimeDistributed(keras.layers.BatchNormalization(
        ...     name="bn"), name="frames")
        >>> model = keras.Sequential([keras.Input((3, 2)), wrapped])
        >>> [name for name, _ in every_layer(model)]
        ['frames', 'frames/bn']
    """
    seen = {id(model)}
    for name, layer in flat_layers(model):
        yield from _within(name, layer, seen)


def _within(name: str, layer: keras.layers.Layer, seen: set):
    if id(layer) in seen:
        return
    seen.add(id(layer))
    yield name, layer
    for value in vars(layer).values():
        values = (value.values() if isinstance(value, dict)
                  else value if isinstance(value, (list, tuple)) else [value])
        for inner in values:
            if isinstance(inner, keras.layers.Layer):
                yield from _within(f"{name}/{inner.name}", inner, seen)
