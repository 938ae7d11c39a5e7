"""A saved `sk.SyncBatchNormalization` loads without strategykit: Keras's own, synchronized.

A `.keras` file names each layer's class, and keeps its weights under a path of the
class name: plain Keras cannot load a class it does not know, nor save one as another
(keras-team/keras, unreported). So for the length of `saving_lib.save_model` each layer
given to `save_as` that the model holds is the Keras class given (a thread calling it
meanwhile runs Keras's): the file loads anywhere as `keras.layers.BatchNormalization(
synchronized=True)`. Pinned on Keras 3.8.0 to 3.15.1, every release.
"""

from __future__ import annotations

import weakref

from strategykit.pinning.fix import Fix, original, resolve

_SAVING_LIB = "keras.src.saving.saving_lib"
_SAVED_AS: dict = {}  # class -> (the Keras class it is saved as, attributes while saved)
_INSTANCES: weakref.WeakSet = weakref.WeakSet()


def save_as(cls: type, keras_class: type, **attributes) -> None:
    """Saves `track`ed layers of `cls` (adding no state) as `keras_class`, `attributes` set."""
    _SAVED_AS[cls] = (keras_class, attributes)


def track(layer) -> None:
    """Makes `layer` known to the fix, and installs it (it alone: the others wait)."""
    _INSTANCES.add(layer)
    FIXES[0].install()


def _save_model(model, filepath, *args, **kwargs):
    held = {id(variable) for variable in model.weights}  # the tracked layers model holds
    saved = [(layer, type(layer), dict(vars(layer))) for layer in list(_INSTANCES)
             if type(layer) in _SAVED_AS and any(id(v) in held for v in layer.weights)]
    try:
        for layer, cls, _ in saved:
            keras_class, attributes = _SAVED_AS[cls]
            layer.__class__ = keras_class
            vars(layer).update(attributes)
        return original(resolve(_SAVING_LIB), "save_model")(model, filepath, *args, **kwargs)
    finally:
        for layer, cls, state in saved:
            layer.__class__ = cls
            vars(layer).update({name: state[name] for name in _SAVED_AS[cls][1]})


FIXES = (
    Fix(
        issue="keras-team/keras (unreported)",
        affects="loading a saved sk.SyncBatchNormalization without strategykit",
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
