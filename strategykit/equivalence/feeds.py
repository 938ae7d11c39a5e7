"""The data of `sk.check`, fed to both runs as users feed `fit()` and `evaluate()`.

One device gets the arrays as Keras batches them (`fit(x, y, sample_weight=w,
batch_size=B, shuffle=False)`); N replicas get `sk.shard` data of the same arrays, the
documented path (each replica its slice of every global batch, the sample weights
carried along, a partial final batch padded with copies weighed -0.0). So the check
sees what `fit()` would do with the user's data, sample weights included.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from strategykit.data.sharding import shard


def unpack(data) -> tuple:
    """`(x, y, sample_weight)` of `data`, `sample_weight` None when there is none.

    Raises:
        ValueError: `data` is not a tuple `(x, y)` or `(x, y, sample_weight)`.

    Example:
        >>> import numpy as np
        >>> x, y, w = unpack((np.zeros((4, 3)), np.ones(4)))
        >>> x.shape, y.shape, w
        ((4, 3), (4,), None)
    """
    if not isinstance(data, (tuple, list)) or len(data) not in (2, 3):
        received = (f"a {type(data).__name__} of {len(data)}" if isinstance(data, (tuple, list))
                    else type(data).__name__)
        raise ValueError(
            "sk.check trains on labeled arrays: data must be (x, y) or (x, y, "
            f"sample_weight). Received: {received}. Pass a tuple of numpy arrays (x may "
            "be a dict or a list of arrays for several inputs)."
        )
    return keras.utils.unpack_x_y_sample_weight(tuple(data))


def examples(data) -> int:
    """The number of examples in `data`."""
    return len(tf.nest.flatten(unpack(data)[0])[0])


def head(data, count: int):
    """The first `count` examples of `data` (all, if fewer).

    Example:
        >>> import numpy as np
        >>> x, y = head((np.arange(100), np.arange(100)), 29)
        >>> len(x), len(y)
        (29, 29)
    """
    return tf.nest.map_structure(lambda array: array[:count], data)


def one_device(data, global_batch_size: int) -> dict:
    """Keyword arguments of `fit()`/`evaluate()` for one device, in global batches."""
    x, y, sample_weight = unpack(data)
    return {"x": x, "y": y, "sample_weight": sample_weight, "batch_size": global_batch_size}


def replicas(data, strategy: tf.distribute.Strategy, global_batch_size: int) -> dict:
    """Keyword arguments of `fit()`/`evaluate()` for N replicas: `sk.shard` data."""
    x, y, sample_weight = unpack(data)
    arrays = (x, y) if sample_weight is None else (x, y, sample_weight)
    return {"x": shard(arrays, strategy, global_batch_size=global_batch_size)}
