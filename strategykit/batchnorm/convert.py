"""`convert_sync_batchnorm`: every BatchNormalization of a model synchronized, in one call.

Where the model's variables belong to the current strategy (the model was built inside
`strategy.scope()`, as Keras's guides do, or no strategy is in use) the model is
converted in place: each `keras.layers.BatchNormalization` object, nested models
included, becomes an `sk.SyncBatchNormalization` (its class is switched; its weights,
name and trainable flag are its own). Every reference the user holds stays valid, so
the transfer-learning idiom (`base_model.trainable = True` after training the head)
works on the converted model. Otherwise (a model built outside the scope it is
converted in) it is cloned into the scope with `keras.models.clone_model(recursive=True)`,
every weight copied exactly and every trainable flag restored, and a warning names the
nested models whose old references no longer reach the converted model.
`synchronized=False` goes the other way, for export to environments without strategykit.
"""

from __future__ import annotations

import warnings

import keras
import tensorflow as tf

from strategykit.batchnorm.layer import SyncBatchNormalization
from strategykit.pinning.legacy_keras import check_not_keras_2

_SUBCLASSED_HINT = (
    "Cloning needs the layer graph of a Sequential or Functional model. In a subclassed "
    "model, build the layers with sk.SyncBatchNormalization(...) instead of "
    "keras.layers.BatchNormalization(...) (same arguments), or build the model with the "
    "Functional API."
)


def convert_sync_batchnorm(model: keras.Model, *, synchronized: bool = True) -> keras.Model:
    """Synchronizes every batch norm layer of `model` (or un-synchronizes them).

    With `synchronized=True` (the default) every `keras.layers.BatchNormalization`,
    also inside nested Sequential and Functional models, becomes an
    `sk.SyncBatchNormalization` with the same arguments. With `synchronized=False`
    every `sk.SyncBatchNormalization` becomes a plain `keras.layers.BatchNormalization`,
    e.g. to export a model trained with synchronized batch norm.

    Where every variable of `model` belongs to the current strategy (build the model
    inside `strategy.scope()`, or use no strategy) the model is converted **in place**
    and returned: weights, names, trainable flags and compilation are its own, and every
    reference to its layers stays valid, so that after
    `model = sk.convert_sync_batchnorm(model)` the fine-tuning step of the transfer
    learning guide, `base_model.trainable = True`, unfreezes the converted model. Convert
    before training: the model's traced train, test and predict functions are dropped.

    Otherwise (the model was built outside the strategy scope it is converted in) a
    converted copy is returned whose variables belong to the current strategy: every
    weight and moving statistic copied exactly, layer and model names and trainable
    flags kept, compiled like the original; the original is not changed. Its nested
    models are new objects, so a `UserWarning` names them: set their trainable flag
    through the copy, `converted.get_layer(name)`.

    Args:
        model: a Sequential or Functional Keras model, e.g. from `keras.applications`.
        synchronized: True (default) to synchronize, False to go back to plain
            `BatchNormalization`.

    Returns:
        `model` itself, converted, or where its variables do not belong to the current
        strategy a converted copy of the same kind.

    Raises:
        ValueError: `model` is not a Keras 3 model (a Keras 2 model from tf_keras, or
            `tf.keras` under `TF_USE_LEGACY_KERAS=1`, included), is (or contains) a
            subclassed model
            whose layers cannot be converted, or uses batch renormalization
            (`renorm=True`).

    Example:
        >>> import keras, strategykit as sk
        >>> base = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8),
        ...                          keras.layers.BatchNormalization()], name="base")
        >>> base.trainable = False
        >>> inputs = keras.Input((4,))
        >>> model = keras.Model(inputs, keras.layers.Dense(1)(base(inputs, training=False)))
        >>> model = sk.convert_sync_batchnorm(model)
        >>> type(base.layers[1]).__name__
        'SyncBatchNormalization'
        >>> base.trainable = True  # fine-tuning: the converted model's base unfreezes
        >>> len(model.trainable_weights)
        6
        >>> model = sk.convert_sync_batchnorm(model, synchronized=False)
        >>> type(base.layers[1]).__name__
        'BatchNormalization'
    """
    check_not_keras_2(model, "model")
    if not isinstance(model, keras.Model):
        received = f"a {type(model).__name__}" if model is not None else "None"
        raise ValueError(
            f"convert_sync_batchnorm expects a Keras model. Received: model={received}. "
            "Pass a keras.Sequential or Functional keras.Model (Keras 3, `import keras`)."
        )
    if not isinstance(synchronized, bool):
        raise ValueError(
            f"synchronized must be True or False. Received: synchronized={synchronized!r}. "
            "Pass True (default) to synchronize, False to go back to BatchNormalization."
        )
    if not _is_graph_model(model):
        raise ValueError(
            f"convert_sync_batchnorm cannot convert the subclassed model "
            f"{model.name!r} ({type(model).__name__}). {_SUBCLASSED_HINT}"
        )
    norms = [layer for layer in _graph_layers(model) if _converts(layer, synchronized)]
    if _belongs_to_current_strategy(model):
        for layer in norms:
            _switch_class(layer, synchronized)
        _drop_traced_functions(model)
        return model
    return _converted_copy(model, synchronized)


def _converts(layer, synchronized: bool) -> bool:
    """Whether `layer` is switched; raises for a layer that cannot be."""
    if synchronized and _is_plain_batch_norm(layer):
        if getattr(layer, "renorm", False):  # Keras 3.14 and later have renorm
            raise ValueError(
                f"Layer {layer.name!r} uses batch renormalization, which "
                "sk.SyncBatchNormalization does not support. Received: renorm=True. "
                "Set synchronized=True on that keras.layers.BatchNormalization "
                "instead, or build it without renorm."
            )
        return True
    return not synchronized and type(layer) is SyncBatchNormalization


def _switch_class(layer, synchronized: bool) -> None:
    """Turns one batch norm layer into the other class, in place (same state: the
    subclass adds none)."""
    layer.synchronized = False  # SyncBatchNormalization synchronizes in its own call
    layer.__class__ = SyncBatchNormalization if synchronized else keras.layers.BatchNormalization


def _belongs_to_current_strategy(model) -> bool:
    strategy = tf.distribute.get_strategy()
    return all(strategy.extended.variable_created_in_scope(weight.value)
               for weight in model.weights)


def _drop_traced_functions(model) -> None:
    """Keras traces `fit`, `evaluate` and `predict` once; the next call retraces."""
    for name in ("train_function", "test_function", "predict_function"):
        if getattr(model, name, None) is not None:
            setattr(model, name, None)


def _converted_copy(model, synchronized: bool):
    """A converted clone of `model` in the current strategy's scope, weights copied."""

    def clone_layer(layer):
        if _converts(layer, synchronized):
            config = layer.get_config()
            config.pop("synchronized", None)
            target = SyncBatchNormalization if synchronized else keras.layers.BatchNormalization
            return target.from_config(config)
        return layer.__class__.from_config(layer.get_config())

    converted = keras.models.clone_model(
        model, input_tensors=_named_inputs(model), clone_function=clone_layer, recursive=True)
    if model.compiled and not converted.compiled:  # Keras 3.8 compiles no Sequential clone
        converted.compile_from_config(model.get_compile_config())
    _copy_state(model, converted)
    nested = [layer.name for layer in model.layers if isinstance(layer, keras.Model)]
    if nested:
        warnings.warn(
            f"convert_sync_batchnorm returned a converted copy of model {model.name!r}: "
            f"its variables were created outside the current strategy's scope "
            f"({type(tf.distribute.get_strategy()).__name__}). Its nested models "
            f"{nested} are new objects in the copy, so a reference to the original (e.g. "
            f"base_model.trainable = True when fine-tuning) changes nothing in it. Use "
            f"converted.get_layer({nested[0]!r}), or build the model inside "
            "strategy.scope() to convert it in place.",
            UserWarning, stacklevel=3)
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


def _graph_layers(model):
    """Every layer of a graph model, nested graph models included; raises for a nested
    subclassed model that holds batch norm layers."""
    for layer in model.layers:
        yield layer
        if isinstance(layer, keras.Model):
            if _is_graph_model(layer):
                yield from _graph_layers(layer)
            else:
                _check_no_batch_norm(layer)


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
