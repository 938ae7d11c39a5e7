"""Callbacks strategykit adds to every `fit()`, `evaluate()` and `predict()`.

Keras has no public place for a callback that every fit should get: each builds its
`keras.callbacks.CallbackList` from the user's list. `add_to_every_fit(make)` makes each
list built from then on for a model of a strategy strategykit made or sharded for
(`strategykit.made.strategies.sharded_for`) also hold `make()`, unless it holds one of
that class already,
through a `Fix` of `CallbackList.__init__` (no upstream issue: Keras has no such hook),
pinned to the `__init__` it calls on every Keras release of the range. strategykit uses
it for the training position of its datasets (`strategykit.data.position`) and, under
`strategykit launch`, for each worker's progress (`strategykit.cluster`). The same place
refuses, for such models, a callback class instead of an instance, and Keras's own
`BackupAndRestore` across several workers (every worker writes its backup in place:
`sk.callbacks.BackupAndRestore` is the one that works there). The callbacks
it adds are `async_safe`, so Keras dispatches the user's callbacks as it would without
them. On a Keras whose `CallbackList.__init__` it does not know, a fit that should get
one of these callbacks refuses (`UnknownUpstreamCode`) rather than run without it.
"""

from __future__ import annotations

import keras

from strategykit.cluster.roles import is_multi_worker
from strategykit.made import strategies
from strategykit.pinning.fix import Fix, original

_MAKERS: list = []  # functions returning a callback, in the order they were added
_CALLBACK_LIST = "keras.src.callbacks.callback_list:CallbackList"


def add_to_every_fit(make) -> None:
    """Adds `make()` to every callback list Keras builds from now on for a model of a
    strategy strategykit made or sharded for; idempotent.

    Args:
        make: a function of no arguments returning a `keras.callbacks.Callback`; a
            class works. Adding the same `make` again does nothing.

    Raises:
        TypeError: from `fit()`, `evaluate()` or `predict()` of such a model given a
            callback class instead of an instance (`callbacks=[NanGuard]`).
        ValueError: from them, given `keras.callbacks.BackupAndRestore` across several
            workers.
        UnknownUpstreamCode: from `fit()`, where Keras's `CallbackList.__init__` is not
            one strategykit was checked on.

    Example:
        >>> import keras, tensorflow as tf
        >>> from strategykit.made import strategies
        >>> class Note(keras.callbacks.Callback):
        ...     async_safe = True
        >>> with strategies.register(tf.distribute.OneDeviceStrategy("/cpu:0")).scope():
        ...     model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
        >>> add_to_every_fit(Note)
        >>> def noted(model):
        ...     callbacks = keras.callbacks.CallbackList([], model=model).callbacks
        ...     return any(isinstance(c, Note) for c in callbacks)
        >>> noted(model), noted(keras.Sequential([keras.layers.Dense(1)]))
        (True, False)
        >>> remove_from_every_fit(Note)
    """
    if make not in _MAKERS:
        _MAKERS.append(make)
    for fix in FIXES:
        fix.install()


def remove_from_every_fit(make) -> None:
    """Undoes `add_to_every_fit(make)`: lists built from now on do not hold `make()`."""
    if make in _MAKERS:
        _MAKERS.remove(make)


def _init_with_added(self, callbacks=None, add_history=False, add_progbar=False, model=None,
                     **params):
    if model is not None and strategies.sharded_for(model.distribute_strategy):
        _check_instances(callbacks)
        if is_multi_worker(model.distribute_strategy):
            _check_no_keras_backup(callbacks)
    original(keras.callbacks.CallbackList, "__init__")(self, callbacks, add_history,
                                                       add_progbar, model, **params)
    if model is None or not strategies.sharded_for(model.distribute_strategy):
        return  # Keras's own list: a model of a strategy strategykit did not make
    for make in _MAKERS:
        callback = make()
        if not any(type(existing) is type(callback) for existing in self.callbacks):
            if model is not None:
                callback.set_model(model)
            callback.set_params(params)
            self.callbacks.append(callback)


def _check_instances(callbacks) -> None:
    """Raises TypeError for a callback class in the list (Keras: `set_model() missing 1
    required positional argument`, from deep in `fit()`)."""
    for callback in (callbacks if isinstance(callbacks, (list, tuple)) else ()):
        if isinstance(callback, type):
            raise TypeError(
                "callbacks must be callback instances, and this is a class. Received: "
                f"callbacks=[..., {callback.__name__}, ...]. Pass {callback.__name__}() "
                "(with its arguments) instead.")


def _check_no_keras_backup(callbacks) -> None:
    """Raises ValueError for Keras's `BackupAndRestore` in a fit across workers: each
    worker writes the same files in place (on one machine h5py's lock fails all but one
    with "unable to lock file"; on a shared disk they tear each other's backup), and a
    worker restores whatever its own disk holds."""
    for callback in (callbacks if isinstance(callbacks, (list, tuple)) else ()):
        if isinstance(callback, keras.callbacks.BackupAndRestore):
            raise ValueError(
                "keras.callbacks.BackupAndRestore writes its backup in place from every "
                "worker: the workers' writes collide (h5py: 'unable to lock file') or tear "
                "each other's files on a shared disk. Received: callbacks=[..., "
                f"{type(callback).__name__}(backup_dir={callback.backup_dir!r}), ...] across "
                "several workers. Use sk.callbacks.BackupAndRestore("
                f"{callback.backup_dir!r}) (Keras's arguments): the chief alone writes, "
                "atomically, and every worker restores the same backup.")


FIXES = (
    Fix(issue="keras-team/keras (unreported)",
        affects="strategykit's callbacks in every fit() (the training position of "
                "sk.shard data, each worker's progress under strategykit launch)",
        owner=_CALLBACK_LIST, attribute="__init__", replacement=_init_with_added,
        relies_on={f"{_CALLBACK_LIST}.__init__": ("d60508a5b7989a7a",  # Keras 3.8-3.11
                                                  "5d0d38afece9158a")},  # Keras 3.12-3.15
        refuses_when=lambda self, callbacks=None, add_history=False, add_progbar=False,
        model=None, **params: bool(_MAKERS) and model is not None
        and strategies.sharded_for(model.distribute_strategy)),
)
