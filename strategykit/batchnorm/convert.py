"""`convert_sync_batchnorm`: every BatchNormalization of a model synchronized, in one call.

Where the model's variables belong to the current strategy (the model was built inside
`strategy.scope()`, as Keras's guides do, or no strategy is in use) the model is
converted in place: each `keras.layers.BatchNormalization` object, in nested models,
custom layers and wrappers too (`strategykit.batchnorm.nested_layers`), becomes an
`sk.SyncBatchNormalization` (its class is switched; its weights, name and trainable
flag are its own). Every reference the user holds stays valid, so
the transfer-learning idiom (`base_model.trainable = True` after training the head)
works on the converted model. Otherwise (a model built outside the scope it is
converted in) it is cloned into the scope with `keras.models.clone_model(recursive=True)`,
every weight copied exactly and every trainable flag restored, and a warning names the
nested models whose old references no longer reach the converted model. A subclass of
Functional (keras-hub's Task models) is made anew from its config instead, of its own
class, its weightless layers (a Task's preprocessor) shared: `clone_model` would return a
plain Functional model without them.
`synchronized=False` goes the other way, for export to environments without strategykit.
"""

from __future__ import annotations

import warnings

import keras
import tensorflow as tf

from strategykit.batchnorm.layer import SyncBatchNormalization, track_saved_layer
from strategykit.batchnorm.nested_layers import every_layer
from strategykit.pinning.legacy_keras import check_not_keras_2

_SUBCLASSED_HINT = (
    "Build the model inside strategy.scope() to convert it in place (any model), or, in a "
    "subclassed model, build the layers with sk.SyncBatchNormalization(...) instead of "
    "keras.layers.BatchNormalization(...) (same arguments), or build the model with the "
    "Functional API."
)


def convert_sync_batchnorm(model: keras.Model, *, synchronized: bool = True) -> keras.Model:
    """Synchronizes every batch norm layer of `model` (or un-synchronizes them).

    With `synchronized=True` (the default) every `keras.layers.BatchNormalization`
    becomes an `sk.SyncBatchNormalization` with the same arguments: also inside nested
    Sequential and Functional models, inside custom layers that hold their own (a
    residual block's `self.norm`, in lists and dicts too) and inside wrappers
    (`TimeDistributed(BatchNormalization())`), wherever `model.layers` does not list it.
    With `synchronized=False` every `sk.SyncBatchNormalization` becomes a plain
    `keras.layers.BatchNormalization`, e.g. to export a model trained with synchronized
    batch norm.

    Where every variable of `model` belongs to the current strategy (build the model
    inside `strategy.scope()`, or use no strategy) the model is converted **in place**
    and returned: weights, names, trainable flags and compilation are its own, and every
    reference to its layers stays valid, so that after
    `model = sk.convert_sync_batchnorm(model)` the fine-tuning step of the transfer
    learning guide, `base_model.trainable = True`, unfreezes the converted model. Convert
    before training: the model's traced train, test and predict functions are dropped.

    A subclassed model is converted in place too (its layers are found in its
    attributes). Otherwise (the model was built outside the strategy scope it is
    converted in) a converted copy is returned whose variables belong to the current strategy: every
    weight and moving statistic copied exactly, layer and model names and trainable
    flags kept, compiled like the original; the original is not changed. Its nested
    models are new objects, so a `UserWarning` names them: set their trainable flag
    through the copy, `converted.get_layer(name)`.

    Args:
        model: a Keras model, e.g. from `keras.applications`; one built outside the
            current strategy's scope must be Sequential or Functional (it is copied).
        synchronized: True (default) to synchronize, False to go back to plain
            `BatchNormalization`.

    Returns:
        `model` itself, converted, or where its variables do not belong to the current
        strategy a converted copy of the same kind.

    Raises:
        ValueError: `model` is not a Keras 3 model (a Keras 2 model from tf_keras, or
            `tf.keras` under `TF_USE_LEGACY_KERAS=1`, included), is (or contains) a
            subclassed model with batch norm layers that must be copied (built outside
            the current strategy's scope), is a subclass of Functional that must be
            copied and cannot be made anew from its config, or uses batch
            renormalization (`renorm=True`).

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
    if _belongs_to_current_strategy(model):
        _switch_every_norm(model, synchronized)
        _drop_traced_functions(model)
        return model
    if not _is_graph_model(model):
        raise ValueError(
            f"convert_sync_batchnorm cannot convert the subclassed model "
            f"{model.name!r} ({type(model).__name__}): its variables were created outside "
            f"the current strategy's scope ({type(tf.distribute.get_strategy()).__name__}), "
            f"so it must be copied into it, and a copy needs a layer graph. "
            f"{_SUBCLASSED_HINT}"
        )
    return _converted_copy(model, synchronized)


def _switch_every_norm(model, synchronized: bool) -> None:
    """Switches, in place, every batch norm layer anywhere in `model`: nested models,
    custom layers, wrappers (`TimeDistributed`), subclassed models."""
    norms = [layer for _, layer in every_layer(model) if _converts(layer, synchronized)]
    for layer in norms:
        _switch_class(layer, synchronized)


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
    if synchronized:
        track_saved_layer(layer)


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
    _check_copyable(model)

    def clone_layer(layer):
        if _converts(layer, synchronized):
            config = layer.get_config()
            config.pop("synchronized", None)
            target = SyncBatchNormalization if synchronized else keras.layers.BatchNormalization
            return target.from_config(config)
        return layer.__class__.from_config(layer.get_config())

    if _is_keras_own_model(model):
        converted = keras.models.clone_model(
            model, input_tensors=_named_inputs(model), clone_function=clone_layer,
            recursive=True)
    else:
        converted = _rebuilt(model)
    if model.compiled and not converted.compiled:  # Keras 3.8 compiles no Sequential clone
        converted.compile_from_config(model.get_compile_config())
    _copy_state(model, converted)
    _switch_every_norm(converted, synchronized)  # those inside custom layers and wrappers
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


def _is_keras_own_model(model) -> bool:
    """A Sequential or Functional model of Keras's own class, which `clone_model` copies
    as it is (the copy of a subclass of them would be a plain Functional model)."""
    return type(model).__module__.split(".")[0] == "keras"


def _rebuilt(model):
    """A subclass of Functional (keras-hub's Tasks: `ResNetImageClassifier`, ...) made
    anew from its config, of its own class, in the current scope. Its layers that hold no
    weights (a Task's preprocessor: its tokenizer's vocabulary is no part of its config)
    are shared with the original; its weights are copied after."""
    config = model.get_config()
    for name in config:
        held = getattr(model, name, None)
        if isinstance(held, keras.layers.Layer) and not held.weights:
            config[name] = held
    try:
        return type(model).from_config(config)
    except Exception as error:  # a subclass that cannot be made anew from its config
        raise ValueError(
            f"convert_sync_batchnorm cannot copy the model {model.name!r} "
            f"({type(model).__name__}) into the current strategy's scope: its variables "
            "were created outside it, and the class cannot be made anew from its "
            f"get_config(). Received: {type(error).__name__}: {error}. Build the model "
            "inside strategy.scope() to convert it in place.") from error


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


def _check_copyable(model) -> None:
    """Raises for a nested subclassed model holding batch norm layers: it has no layer
    graph to clone (a model converted in place needs none)."""
    for layer in model.layers:
        if isinstance(layer, keras.Model):
            if _is_graph_model(layer):
                _check_copyable(layer)
                continue
            found = [name for name, inner in every_layer(layer)
                     if isinstance(inner, keras.layers.BatchNormalization)]
            if found:
                raise ValueError(
                    f"The nested subclassed model {layer.name!r} ({type(layer).__name__}) "
                    f"holds batch norm layers {found} that cannot be converted in a copy. "
                    f"{_SUBCLASSED_HINT}"
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
        # A wrapped layer's weights may be built under another scope in the clone
        # (`frames/frame_norm/gamma` there, `frame_norm/gamma` here): layer and weight agree
        if _own_path(old) != _own_path(new) or tuple(old.shape) != tuple(new.shape):
            raise RuntimeError(
                f"Weight {old.path} {tuple(old.shape)} of the original model lines up "
                f"with {new.path} {tuple(new.shape)} of the converted one; please report "
                "this with the model's summary()."
            )
        new.assign(old)


def _own_path(weight) -> list:
    """The last two parts of a weight's path: its layer and its own name."""
    return weight.path.split("/")[-2:]


def _layer_pairs(source, target):
    """(original, clone) pairs, parents before their nested layers."""
    yield source, target
    if isinstance(source, keras.Model) and _is_graph_model(source):
        for old, new in zip(source.layers, target.layers):
            yield from _layer_pairs(old, new)
