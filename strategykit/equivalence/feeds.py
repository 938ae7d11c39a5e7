"""The data of `sk.check`, fed to both runs as users feed `fit()` and `evaluate()`.

One device gets the arrays as Keras batches them (`fit(x, y, sample_weight=w,
batch_size=B, shuffle=False)`); N replicas get `sk.shard` data of the same arrays, the
documented path (each replica its slice of every global batch, the sample weights
carried along, a partial final batch padded with copies weighed -0.0). So the check
sees what `fit()` would do with the user's data, sample weights included. Data without
labels (an autoencoder's, a VAE's) is fed as its inputs alone, as `fit(x)` feeds it; an
unbatched `tf.data.Dataset` is read into arrays first (`materialized`).
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from strategykit.data.sharding import shard
from strategykit.data.sources import check_unbatched


def unpack(data) -> tuple:
    """`(x, y, sample_weight)` of `data`, `y` and `sample_weight` None where there are none.

    `data` is labeled, `(x, y)` or `(x, y, sample_weight)`, or holds inputs only: an
    array, a dict of arrays or `(x,)` (an autoencoder's, a VAE's or a self-supervised
    model's, whose `train_step` takes `x`).

    Raises:
        ValueError: `data` is a tuple or list of another length, or not arrays.

    Example:
        >>> import numpy as np
        >>> x, y, w = unpack((np.zeros((4, 3)), np.ones(4)))
        >>> x.shape, y.shape, w
        ((4, 3), (4,), None)
        >>> x, y, w = unpack(np.zeros((4, 3)))
        >>> x.shape, y, w
        ((4, 3), None, None)
    """
    if isinstance(data, (tuple, list)) and len(data) in (1, 2, 3):
        return keras.utils.unpack_x_y_sample_weight(tuple(data))
    if isinstance(data, dict) or hasattr(data, "shape"):
        return data, None, None
    received = (f"a {type(data).__name__} of {len(data)}" if isinstance(data, (tuple, list))
                else type(data).__name__)
    raise ValueError(
        "sk.check trains on arrays: data must be (x, y), (x, y, sample_weight), or the "
        f"inputs alone (an array, a dict of arrays, or (x,)). Received: {received}. Pass "
        "numpy arrays (x may be a dict or a list of arrays for several inputs), or an "
        "unbatched tf.data.Dataset of such elements."
    )


def labeled(data) -> bool:
    """Whether `data` holds labels (`y`), not only inputs."""
    return unpack(data)[1] is not None


def materialized(data, count: int):
    """`data` as arrays: the first `count` examples of an unbatched `tf.data.Dataset`
    (its elements stacked), or `data` itself when it is not a dataset.

    Raises:
        ValueError: a dataset that is already batched.

    Example:
        >>> import tensorflow as tf
        >>> x, y = materialized(tf.data.Dataset.range(10).map(lambda i: (i, 2 * i)), 4)
        >>> x.tolist(), y.tolist()
        ([0, 1, 2, 3], [0, 2, 4, 6])
    """
    if not isinstance(data, tf.data.Dataset):
        return data
    check_unbatched(data, "data")
    elements = list(data.take(count).as_numpy_iterator())
    if not elements:
        raise ValueError("sk.check got an empty tf.data.Dataset. Received: 0 examples. Pass "
                         "a dataset of at least steps x global_batch_size examples.")
    stacked = tf.nest.map_structure(lambda *values: np.stack(values), *elements)
    return tuple(stacked) if isinstance(stacked, list) else stacked


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


def partial_final_batch(data, global_batch_size: int, accumulation: int) -> int:
    """The real examples of the final training batch of each epoch of the check: half a
    global batch for labeled data (padded on N replicas with copies weighed -0.0, as at
    the end of most data); 0 (whole batches only) for inputs alone, which carry no
    weights to mark a copy, or with accumulation (an update of several micro-batches).

    Example:
        >>> import numpy as np
        >>> partial_final_batch((np.zeros(40), np.zeros(40)), 8, 1)
        4
        >>> partial_final_batch(np.zeros(40), 8, 1)
        0
    """
    return global_batch_size // 2 if labeled(data) and accumulation == 1 else 0


def dataset_head(dataset: tf.data.Dataset, count: int) -> tf.data.Dataset:
    """The first `count` examples of an unbatched dataset, still a dataset: of a size
    tf.data knows only where it knows the dataset's."""
    return dataset.take(count)


def replicas(data, strategy: tf.distribute.Strategy, global_batch_size: int) -> dict:
    """Keyword arguments of `fit()`/`evaluate()` for N replicas: `sk.shard` data (of the
    arrays, or of an unbatched dataset as it is)."""
    if isinstance(data, tf.data.Dataset):
        return {"x": shard(data, strategy, global_batch_size=global_batch_size)}
    x, y, sample_weight = unpack(data)
    arrays = x if y is None else (x, y) if sample_weight is None else (x, y, sample_weight)
    return {"x": shard(arrays, strategy, global_batch_size=global_batch_size)}
