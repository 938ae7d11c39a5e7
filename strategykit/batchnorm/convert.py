"""`convert_sync_batchnorm`: every BatchNormalization of a model synchronized, in one call.

The model is cloned with `keras.models.clone_model(recursive=True)`: each
`keras.layers.BatchNormalization` (nested models included) becomes an
`sk.SyncBatchNormalization` with the same configuration, every other layer is rebuilt
from its config, and then every weight (moving statistics included) is copied exactly
and every trainable flag restored. `synchronized=False` goes the other way, for export
to environments without strategykit.
"""

from __future__ import annotations

import keras

from strategykit.batchnorm.layer import SyncBatchNormalization

_SUBCLASSED_HINT = (
    "Cloning needs the layer graph of a Sequential or Functional model. In a subclassed "
    "model, build the layers with sk.SyncBatchNormalization(...) instead of "
    "keras.layers.BatchNormalization(...) (same arguments), or build the model with the "
    "Functional API."
)


def convert_sync_batchnorm(model: keras.Model, *, synchronized: bool = True) -> keras.Model:
    """Returns a copy of `model` whose batch norm layers are all synchronized (or not).

    With `synchronized=True` (the default) every `keras.layers.BatchNormalization`,
    also inside nested Sequential and Functional models, becomes an
    `sk.SyncBatchNormalization` with the same arguments. With `synchronized=False`
    every `sk.SyncBatchNormalization` becomes a plain `keras.layers.BatchNormalization`,
    e.g. to export a model trained with synchronized batch norm. All other layers are
    fresh copies. Every weight and moving statistic is copied exactly; layer and model
    names and trainable flags are kept; a compiled model comes back compiled with the
    same configuration. The original model is not changed.

    Call it inside `strategy.scope()` so that the new variables belong to the strategy.

    Args:
        model: a Sequential or Functional Keras model, e.g. from `keras.applications`.
        synchronized: True (default) to synchronize, False to go back to plain
            `BatchNormalization`.

    Returns:
        A new Keras model of the same kind.

    Raises:
        ValueError: `model` is not a Keras model, is (or contains) a subclassed model
            whose layers cannot be cloned, or uses batch renormalization (`renorm=True`).

    Example:
        >>> import keras, strategykit as sk
        >>> model = keras.Sequential([
        ...     keras.Input((4,)), keras.layers.Dense(8), keras.layers.BatchNormalization()])
        >>> synced = sk.convert_sync_batchnorm(model)
        >>> type(synced.layers[1]).__name__
        'SyncBatchNormalization'
        >>> type(sk.convert_sync_batchnorm(synced, synchronized=False).layers[1]).__name__
        'BatchNormalization'
    """
    if not isinstance(model, keras.Model):
        raise ValueError(
            f"convert_sync_batchnorm expects a Keras model. Received: "
            f"{type(model).__name__}. Pass a keras.Sequential or Functional keras.Model."
        )
    if not isinstance(synchronized, bool):
        raise ValueError(
            f"synchronized must be True or False. Received: synchronized={synchronized!r}."
        )
    if not _is_graph_model(model):
        raise ValueError(
            f"convert_sync_batchnorm cannot convert the subclassed model "
            f"{model.name!r} ({type(model).__name__}). {_SUBCLASSED_HINT}"
        )

    def clone_layer(layer):
        if isinstance(layer, keras.Model):  # nested graph models never get here
            _check_no_batch_norm(layer)
        if synchronized and _is_plain_batch_norm(layer):
            if getattr(layer, "renorm", False):  # Keras 3.14 and later have renorm
                raise ValueError(
                    f"Layer {layer.name!r} uses batch renormalization, which "
                    "sk.SyncBatchNormalization does not support. Received: renorm=True. "
                    "Set synchronized=True on that keras.layers.BatchNormalization "
                    "instead, or build it without renorm."
                )
            config = layer.get_config()
            config.pop("synchronized", None)
            return SyncBatchNormalization.from_config(config)
        if not synchronized and isinstance(layer, SyncBatchNormalization):
            return keras.layers.BatchNormalization.from_config(layer.get_config())
        return layer.__class__.from_config(layer.get_config())

    converted = keras.models.clone_model(
        model, input_tensors=_named_inputs(model), clone_function=clone_layer, recursive=True)
    if model.compiled and not converted.compiled:  # Keras 3.8 compiles no Sequential clone
        converted.compile_from_config(model.get_compile_config())
    _copy_state(model, converted)
    return converted


def _is_graph_model(model) -> bool:
    """Sequential and Functional models have a layer graph; subclassed models do not."""
    return isinstance(model, keras.Sequential) or (
        hasattr(model, "inputs") and hasattr(model, "outputs")
    )


def _named_inputs(model):
    """New inputs named like the model's input layers (clone_model renames unnamed ones)."""
    if isinstance(model, keras.Sequential):
        return None  # clone_model keeps a Sequential's input layer and its name
    names = {id(layer.output): layer.name for layer in model.layers
             if isinstance(layer, keras.layers.InputLayer)}
    return keras.tree.map_structure(
        lambda tensor: keras.Input(batch_shape=tensor.shape, dtype=tensor.dtype,
                                   name=names.get(id(tensor), tensor.name)),
        model.input)


def _is_plain_batch_norm(layer) -> bool:
    return type(layer) is keras.layers.BatchNormalization


def _check_no_batch_norm(model: keras.Model) -> None:
    """Raises when a subclassed model nested in the model holds batch norm layers."""
    found = [layer.name for layer in model.layers
             if isinstance(layer, keras.layers.BatchNormalization)]
    if found:
        raise ValueError(
            f"The nested subclassed model {model.name!r} ({type(model).__name__}) holds "
            f"batch norm layers {found} that cannot be converted. {_SUBCLASSED_HINT}"
        )


def _copy_state(source: keras.Model, target: keras.Model) -> None:
    """Copies every weight exactly and restores trainable flags, layer by layer."""
    for old, new in _layer_pairs(source, target):
        new.trainable = old.trainable
    if len(source.weights) != len(target.weights):
        raise RuntimeError(
            f"The converted model has {len(target.weights)} weights, the original "
            f"{len(source.weights)}; please report this with the model's summary()."
        )
    for old, new in zip(source.weights, target.weights):
        if old.path != new.path or tuple(old.shape) != tuple(new.shape):
            raise RuntimeError(
                f"Weight {old.path} {tuple(old.shape)} of the original model lines up "
                f"with {new.path} {tuple(new.shape)} of the converted one; please report "
                "this with the model's summary()."
            )
        new.assign(old)


def _layer_pairs(source, target):
    """(original, clone) pairs, parents before their nested layers."""
    yield source, target
    if isinstance(source, keras.Model) and _is_graph_model(source):
        for old, new in zip(source.layers, target.layers):
            yield from _layer_pairs(old, new)
