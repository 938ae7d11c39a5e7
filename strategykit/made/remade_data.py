"""`sk.shard` data that the fixes remake with other batch options.

A distributed dataset has no `map`, so where Keras or keras-hub would map a function over
a dataset's batches (Keras's `class_weight`, keras-hub's preprocessor), the fixes ask the
data `sk.shard` made to remake itself with that function inside its input pipeline,
before each batch is padded and distributed. `sk.shard` registers, with each dataset it
makes, how to remake it (`register`); the fixes look it up (`remaker_of`) and read what
a dataset was made with (`options_of`). Any other dataset has neither.
"""

from __future__ import annotations

import weakref

_REMAKERS = weakref.WeakKeyDictionary()  # dataset -> (remake, options)


def register(dataset, remake, options: dict | None = None) -> None:
    """Lets the fixes remake `dataset` with `remake(**changed_options)`.

    Args:
        dataset: a (distributed) dataset made by `sk.shard`.
        remake: `remake(**changes)` returns the same data made with the batch options
            `changes` (`class_weights`, `preprocess`; see `strategykit.data.pipeline`)
            on top of `options`; it raises `ValueError` where the data cannot take them.
        options: the batch options `dataset` was made with. Default: none.

    Example:
        >>> import tensorflow as tf
        >>> data = tf.data.Dataset.range(3)
        >>> register(data, lambda **changes: data)
        >>> remaker_of(data) is not None, options_of(data)
        (True, {})
    """
    _REMAKERS[dataset] = (remake, dict(options or {}))


def remaker_of(dataset):
    """The `remake(**changes)` registered for `dataset`, or None."""
    return _entry(dataset)[0]


def options_of(dataset) -> dict:
    """The batch options `dataset` was made with (empty for any other dataset)."""
    return dict(_entry(dataset)[1])


def _entry(dataset):
    try:
        return _REMAKERS.get(dataset, (None, {}))
    except TypeError:  # not weakly referable: not one of sk.shard's
        return None, {}
