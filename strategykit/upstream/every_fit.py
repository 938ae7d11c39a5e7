"""Callbacks strategykit adds to every `fit()`, `evaluate()` and `predict()`.

Keras has no public place for a callback that every fit should get: each builds its
`keras.callbacks.CallbackList` from the user's list. `add_to_every_fit(make)` wraps
`CallbackList.__init__` (public API, once) so that each list built from then on also
holds `make()`, unless it holds one of that class already. strategykit uses it for the
training position of its datasets (`strategykit.data.position`) and, under
`strategykit launch`, for each worker's progress (`strategykit.cluster.progress_reporter`).
The callbacks it adds are `async_safe`, so Keras dispatches the user's callbacks as it
would without them.
"""

from __future__ import annotations

import keras

_MAKERS: list = []  # functions returning a callback, in the order they were added
_ORIGINAL_INIT = keras.callbacks.CallbackList.__init__


def add_to_every_fit(make) -> None:
    """Adds `make()` to every callback list Keras builds from now on; idempotent.

    Args:
        make: a function of no arguments returning a `keras.callbacks.Callback`; a
            class works. Adding the same `make` again does nothing.

    Example:
        >>> import keras
        >>> class Note(keras.callbacks.Callback):
        ...     async_safe = True
        >>> add_to_every_fit(Note)
        >>> any(isinstance(c, Note) for c in keras.callbacks.CallbackList([]).callbacks)
        True
        >>> remove_from_every_fit(Note)
    """
    if make not in _MAKERS:
        _MAKERS.append(make)
    keras.callbacks.CallbackList.__init__ = _init_with_added


def remove_from_every_fit(make) -> None:
    """Undoes `add_to_every_fit(make)`; Keras's own `__init__` returns with the last."""
    if make in _MAKERS:
        _MAKERS.remove(make)
    if not _MAKERS:
        keras.callbacks.CallbackList.__init__ = _ORIGINAL_INIT


def _init_with_added(self, callbacks=None, add_history=False, add_progbar=False, model=None,
                     **params):
    _ORIGINAL_INIT(self, callbacks, add_history, add_progbar, model, **params)
    for make in _MAKERS:
        callback = make()
        if not any(type(existing) is type(callback) for existing in self.callbacks):
            if model is not None:
                callback.set_model(model)
            callback.set_params(params)
            self.callbacks.append(callback)
