"""Where `sk.shard`'s examples come from: arrays, an unbatched dataset, or a function.

Every input becomes a function `input_context -> unbatched tf.data.Dataset` and, when it
is known, the number of examples. An input that is already batched is reported, not
batched twice.
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from strategykit.upstream.dataset_inputs import input_datasets


def examples_source(data):
    """A function `context -> unbatched tf.data.Dataset`, and the size when known."""
    if isinstance(data, keras.layers.Layer):  # callable, yet no fn(input_context)
        raise ValueError(
            f"data must be the examples, not a model. Received: data=a {type(data).__name__}"
            " (a Keras model or layer). Pass numpy arrays, a tuple (x, y) or dict of arrays,"
            " an unbatched tf.data.Dataset, or fn(input_context) -> tf.data.Dataset, and "
            "the model to fit() afterwards.")
    if callable(data) and not isinstance(data, tf.data.Dataset):
        return (lambda context: check_unbatched(data(context), "fn(input_context)")), None
    if isinstance(data, tf.data.Dataset):
        check_unbatched(data, "data")
        cardinality = int(data.cardinality())
        return (lambda context: data), (cardinality if cardinality >= 0 else None)
    arrays = _as_arrays(data)
    lengths = {path: len(a) for path, a in _paths(arrays)}
    if len(set(lengths.values())) > 1:
        raise ValueError(
            f"The arrays of data have different lengths: {lengths}. Received: data with "
            f"{len(lengths)} arrays. Pass arrays with one entry per example each."
        )
    size = next(iter(lengths.values()))
    return (lambda context: tf.data.Dataset.from_tensor_slices(arrays)), size


def check_unbatched(dataset, what: str) -> tf.data.Dataset:
    """Raises ValueError when `dataset` is not a `tf.data.Dataset` or is already batched."""
    if not isinstance(dataset, tf.data.Dataset):
        raise ValueError(
            f"{what} must be a tf.data.Dataset. Received: {type(dataset).__name__}. Return "
            "an unbatched tf.data.Dataset of examples."
        )
    found = _batching_transformation(dataset)
    if found:
        raise ValueError(
            f"{what} is already batched ({found} found); sk.shard batches it itself and "
            f"would batch it twice. Received: element_spec={dataset.element_spec}. Pass "
            "the dataset before .batch(...), or call .unbatch() on it."
        )
    return dataset


# tf.data has no public way to ask whether a dataset is batched: its element_spec looks
# the same as one of variable-length examples. This walks the chain of transformations
# (`strategykit.upstream.dataset_inputs`) and looks at their class names
# (`_BatchDataset`, `_PaddedBatchDataset`, ...).
_BATCH_CLASS_WORDS = ("Batch", "GroupByWindow")


def _batching_transformation(dataset) -> str | None:
    name = type(dataset).__name__
    if "Unbatch" in name:
        return None
    if any(word in name for word in _BATCH_CLASS_WORDS):
        return name.strip("_").replace("Dataset", "").lower()
    for parent in input_datasets(dataset):
        found = _batching_transformation(parent)
        if found:
            return found
    return None


def _as_arrays(data):
    if isinstance(data, (str, bytes)) or data is None:
        raise ValueError(
            f"Unsupported data for sk.shard. Received: {type(data).__name__}. Pass numpy "
            "arrays, a tuple (x, y) or dict of arrays, an unbatched tf.data.Dataset, or "
            "fn(input_context) -> tf.data.Dataset."
        )
    if isinstance(data, tuple):
        if len(data) > 3 or not data:
            raise ValueError(
                f"A tuple of data must be (x,), (x, y) or (x, y, sample_weight). Received: "
                f"a tuple of {len(data)}. Group several inputs in a tuple or dict: "
                "((x1, x2), y)."
            )
        return tuple(_as_arrays(part) for part in data)
    if _is_list_of_inputs(data):  # [x1, x2]: several inputs, as Keras reads a list
        return tuple(_as_arrays(part) for part in data)
    if isinstance(data, dict):
        return {key: _as_arrays(value) for key, value in data.items()}
    array = np.asarray(data)
    if array.ndim == 0:
        raise ValueError(
            f"data must hold one entry per example. Received: a scalar {data!r}. Pass an "
            "array of examples, e.g. np.arange(10)."
        )
    return array


def _is_list_of_inputs(data) -> bool:
    """A list of arrays (each with a batch dimension): several inputs, not one array.

    Example:
        >>> import numpy as np
        >>> _is_list_of_inputs([np.zeros((4, 2)), np.zeros(4)]), _is_list_of_inputs([1, 2])
        (True, False)
    """
    return (isinstance(data, list) and bool(data)
            and all(getattr(part, "ndim", 0) >= 1 for part in data))


def _paths(tree, prefix="data"):
    if isinstance(tree, tuple):
        for i, part in enumerate(tree):
            yield from _paths(part, f"{prefix}[{i}]")
    elif isinstance(tree, dict):
        for key, part in tree.items():
            yield from _paths(part, f"{prefix}[{key!r}]")
    else:
        yield prefix, tree


def check_size(size, global_batch_size, remainder):
    if size == 0 or (remainder == "drop" and size < global_batch_size):
        raise ValueError(
            f"The data holds {size} examples: no batch to make. Received: {size} examples, "
            f"global_batch_size={global_batch_size}, drop_remainder="
            f"{remainder == 'drop'}. Pass more data or a smaller global_batch_size."
        )
