"""What the callbacks build for a model once and reuse while the model's variables stay.

Hooked step functions and the replica inspector cost a trace each (seconds for a large
model), and the accumulators and weight snapshot are new variables. In a notebook
`fit()` is called again and again on one model, usually with a new callback each time,
so these are kept with the model, in its instance dictionary: outside Keras's tracking,
so they are never weights, never saved, and go away with the model. An entry is built
again when the variables it was built for are no longer the model's (a new optimizer,
a rebuilt model).
"""

from __future__ import annotations

from collections.abc import Callable

_ATTRIBUTE = "_strategykit_cache"


def cached(model, key: str, *, variables, build: Callable[[], object]):
    """The entry `key` of `model`'s cache, built anew when `variables` have changed.

    Args:
        model: a Keras model.
        key: the entry's name.
        variables: the variables the entry depends on, in order.
        build: makes the entry.

    Returns:
        The cached entry, or the one `build()` just made.

    Example:
        >>> import keras
        >>> from strategykit.callbacks import model_cache
        >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        >>> first = model_cache.cached(model, "n", variables=model.weights, build=object)
        >>> first is model_cache.cached(model, "n", variables=model.weights, build=object)
        True
    """
    cache = model.__dict__.get(_ATTRIBUTE)
    if cache is None:
        cache = {}
        object.__setattr__(model, _ATTRIBUTE, cache)  # past Keras's attribute tracking
    variables = tuple(variables)
    entry = cache.get(key)
    if entry is None or not _same(entry[0], variables):
        entry = cache[key] = (variables, build())
    return entry[1]


def _same(a: tuple, b: tuple) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b))
