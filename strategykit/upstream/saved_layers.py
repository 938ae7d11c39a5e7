"""A saved `sk.SyncBatchNormalization` loads without strategykit: Keras's own, synchronized.

A `.keras` file (`model.save`, `keras.saving.save_model`, `ModelCheckpoint`) names each
layer's class, and keeps its weights under a path made of its class name
(`layers/sync_batch_normalization/vars`). Plain Keras cannot load a class it does not
know: `TypeError: Could not locate class 'SyncBatchNormalization'` where strategykit is
not installed (a server, another notebook). Keras has no way to save an object as
another class (keras-team/keras, unreported), so the fix replaces `saving_lib.save_model`:
while a model is saved, each layer of a class registered with `save_as` that the model
holds is saved as the Keras class given, with the attributes given
(`keras.layers.BatchNormalization` with `synchronized=True`): its config, its class name
and its weights' path are Keras's own. The file then loads anywhere, strategykit
imported or not, as `keras.layers.BatchNormalization(synchronized=True)`, which trains
synchronized (exact on `sk.shard` data: `strategykit.upstream.batch_norm_moments`);
`sk.convert_sync_batchnorm` makes it an `sk.SyncBatchNormalization` again. The layers
are themselves again when the save returns (or raises). Models without such a layer are
saved as Keras saves them.

A layer is saved as another class for the length of the save: another thread calling
it then would run Keras's class (Keras saves between steps, on the thread that trains).
Checked on Keras 3.8.0 to 3.15.1, every release of the range (`save_model` is the same
on all; `_save_container_state`, which names the weights' path by the class, in three
forms). On unknown code the fix hands over to Keras: the file needs strategykit to load.
"""

from __future__ import annotations

import weakref

from strategykit.pinning.fix import Fix, original, resolve

_SAVING_LIB = "keras.src.saving.saving_lib"
_SAVED_AS: dict = {}  # class -> (the Keras class it is saved as, attributes while saved)
_INSTANCES: weakref.WeakSet = weakref.WeakSet()


def save_as(cls: type, keras_class: type, **attributes) -> None:
    """Makes `.keras` files save the layers of `cls` as `keras_class` with `attributes`.

    Args:
        cls: a subclass of `keras_class` adding no state, whose instances are made
            known with `track` (its `__init__` does).
        keras_class: the Keras class to save them as.
        **attributes: attribute values while saved (e.g. `synchronized=True`).
    """
    _SAVED_AS[cls] = (keras_class, attributes)


def track(layer) -> None:
    """Makes `layer` (of a class given to `save_as`) known to the saving fix."""
    _INSTANCES.add(layer)


def _held_layers(model) -> list:
    """The tracked layers whose variables `model` holds."""
    held = {id(variable) for variable in model.weights}
    return [layer for layer in list(_INSTANCES) if type(layer) in _SAVED_AS
            and any(id(variable) in held for variable in layer.weights)]


def _save_model(model, filepath, *args, **kwargs):
    own = original(resolve(_SAVING_LIB), "save_model")
    layers = _held_layers(model) if _SAVED_AS else []
    saved = []
    try:
        for layer in layers:
            keras_class, attributes = _SAVED_AS[type(layer)]
            saved.append((layer, type(layer), {name: getattr(layer, name)
                                               for name in attributes}))
            layer.__class__ = keras_class
            for name, value in attributes.items():
                setattr(layer, name, value)
        return own(model, filepath, *args, **kwargs)
    finally:
        for layer, cls, values in saved:
            layer.__class__ = cls
            for name, value in values.items():
                setattr(layer, name, value)


FIXES = (
    Fix(
        issue="keras-team/keras (unreported)",
        affects="loading a saved sk.SyncBatchNormalization where strategykit is not installed",
        owner=_SAVING_LIB,
        attribute="save_model",
        replacement=_save_model,
        relies_on={
            # replaced: saves the model's config and weights, walking its layers
            f"{_SAVING_LIB}:save_model": "0b360baae4175255",
            # names each layer's weights by its class name
            f"{_SAVING_LIB}:_save_container_state": (
                "ffa18707ab6eb9e2", "1a6e8e8c803399a5", "2ef3b8c0ca3bedec"),
            # writes each layer's class and config (`get_config()`)
            "keras.src.saving.serialization_lib:serialize_keras_object": "fa3e9444c5e32892",
        },
    ),
)
