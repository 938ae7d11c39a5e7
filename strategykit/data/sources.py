"""Where `sk.shard`'s examples come from: arrays, an unbatched dataset, or a function.

Every input becomes a function `input_context -> unbatched tf.data.Dataset` and, when it
is known, the number of examples. An input that is already batched is reported, not
batched twice.
"""

from __future__ import annotations

import inspect
import types

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
        _check_takes_a_context(data)
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
    if isinstance(arrays, tuple) and len(arrays) == 3:
        _check_no_negative_zero(arrays[2])
    return (lambda context: tf.data.Dataset.from_tensor_slices(arrays)), size


def _check_takes_a_context(function) -> None:
    """Raises ValueError for a function that cannot be called with one argument, the
    `tf.distribute.InputContext` that `distribute_datasets_from_function` passes."""
    try:
        inspect.signature(function).bind(None)
    except ValueError:  # no signature to read (a builtin): let the call tell
        return
    except TypeError:
        name = getattr(function, "__name__", type(function).__name__)
        raise ValueError(
            "A function passed as data is called with the input_context of each input "
            "pipeline (tf.distribute's distribute_datasets_from_function), and this one "
            f"takes no such argument. Received: {name}{inspect.signature(function)}. "
            "Define it as def make_dataset(input_context): ... (it may ignore it), or pass "
            "the tf.data.Dataset itself.") from None


def _check_no_negative_zero(sample_weight) -> None:
    """Raises ValueError for a sample weight of -0.0: the mark of a padded copy."""
    for weight in tf.nest.flatten(sample_weight):
        if not np.issubdtype(weight.dtype, np.floating):
            continue
        marked = np.flatnonzero(((weight == 0) & np.signbit(weight)).reshape(len(weight), -1)
                                .any(axis=1))
        if marked.size:
            raise ValueError(
                "sample_weight holds -0.0 (negative zero), the weight sk.shard gives the "
                "padded copies of a final batch, so Keras would count those examples as "
                f"copies: left out of every metric. Received: -0.0 at example "
                f"{int(marked[0])}{f' and {marked.size - 1} more' if marked.size > 1 else ''}"
                ". Pass sample_weight + 0.0 (which turns -0.0 into 0.0) to weigh them 0.")


def check_unbatched(dataset, what: str) -> tf.data.Dataset:
    """Raises ValueError when `dataset` is not a `tf.data.Dataset` or is already batched."""
    if not isinstance(dataset, tf.data.Dataset):
        raise ValueError(
            f"{what} must be a tf.data.Dataset. Received: {type(dataset).__name__}. Return "
            "an unbatched tf.data.Dataset of examples."
        )
    _check_no_nested_elements(dataset, what)
    found = _batching_transformation(dataset)
    if found:
        raise ValueError(
            f"{what} is already batched ({found} found); sk.shard batches it itself and "
            f"would batch it twice. Received: element_spec={dataset.element_spec}. Pass "
            "the dataset before .batch(...), or call .unbatch() on it."
        )
    return dataset


def _check_no_nested_elements(dataset, what: str) -> None:
    """Raises ValueError for elements that are datasets (`.window()`) or ragged tensors,
    which sk.shard cannot batch into one tensor a step."""
    specs = tf.nest.flatten(dataset.element_spec)
    if any(isinstance(spec, tf.data.DatasetSpec) for spec in specs):
        raise ValueError(
            f"{what} has elements that are datasets themselves (windows, from "
            f".window()), which sk.shard cannot batch. Received: element_spec="
            f"{dataset.element_spec}. Turn each window into one example first: "
            ".window(n, drop_remainder=True).flat_map(lambda w: w.batch(n)) (zip the "
            "windows of a tuple: lambda x, y: tf.data.Dataset.zip((x.batch(n), y.batch(n)))).")
    if any(isinstance(spec, tf.RaggedTensorSpec) for spec in specs):
        raise ValueError(
            f"{what} has ragged elements (tf.RaggedTensor), which sk.shard cannot batch "
            f"into one tensor a step. Received: element_spec={dataset.element_spec}. Pad "
            "every example to one shape first (keras.utils.pad_sequences on the lists of "
            "examples) and pass the padded arrays.")


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


_FROM_GENERATOR = (
    "tf.data.Dataset.from_generator(lambda: ((x, y) for x, y in ...), output_signature="
    "(tf.TensorSpec(x_shape, x_dtype), tf.TensorSpec((), y_dtype))), one example per "
    "element (unbatched), or the arrays themselves")


def _check_not_batches_or_a_stream(data) -> None:
    """Raises ValueError for a `PyDataset`, a generator or a list of examples: inputs
    numpy cannot stack, which it would report as an inhomogeneous shape."""
    if isinstance(data, keras.utils.PyDataset):
        raise ValueError(
            "sk.shard takes examples, and a keras.utils.PyDataset yields batches of its own "
            f"size, which it would batch again. Received: a {type(data).__name__}. Pass its "
            f"examples as arrays, or as {_FROM_GENERATOR}.")
    if isinstance(data, types.GeneratorType) or (hasattr(data, "__next__")
                                                 and not hasattr(data, "__len__")):
        raise ValueError(
            "sk.shard reads its data once per epoch, and a generator or iterator can be read "
            f"only once. Received: a {type(data).__name__}. Pass {_FROM_GENERATOR}.")
    if isinstance(data, list) and data and all(isinstance(part, (tuple, dict))
                                                for part in data):
        raise ValueError(
            "sk.shard takes arrays of examples, not a list of examples. Received: a list of "
            f"{len(data)} {type(data[0]).__name__}s. Stack them: (np.stack([x for x, _ in "
            "pairs]), np.array([y for _, y in pairs])), or pass "
            f"{_FROM_GENERATOR}.")


def _as_arrays(data, path="data"):
    _check_not_batches_or_a_stream(data)
    if isinstance(data, (tuple, dict)) and not data:
        raise ValueError(
            f"{path} holds no arrays: sk.shard has no examples to take. Received: "
            f"{path}={data!r}. Pass the examples, e.g. (x, y) or {{'image': x, 'label': y}}.")
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
        return tuple(_as_arrays(part, f"{path}[{i}]") for i, part in enumerate(data))
    if _is_list_of_inputs(data):  # [x1, x2]: several inputs, as Keras reads a list
        return tuple(_as_arrays(part, f"{path}[{i}]") for i, part in enumerate(data))
    if isinstance(data, dict):
        return {key: _as_arrays(value, f"{path}[{key!r}]") for key, value in data.items()}
    try:
        array = np.asarray(data)
    except ValueError:  # numpy: "inhomogeneous shape"
        raise _ragged(data, path) from None
    if array.dtype == object and not all(isinstance(value, (str, bytes))
                                         for value in array.ravel()):
        raise _ragged(data, path)
    if array.ndim == 0:
        raise ValueError(
            f"data must hold one entry per example. Received: a scalar {data!r}. Pass an "
            "array of examples, e.g. np.arange(10)."
        )
    return array


def _ragged(data, path: str) -> ValueError:
    first, other = _shapes_that_differ(data)
    return ValueError(
        f"sk.shard takes arrays with one shape for every example, and the examples of "
        f"{path} differ: {first} and {other}. Received: {path}, a {type(data).__name__} of "
        "examples of different shapes. Pad them to one shape (keras.utils.pad_sequences "
        "for sequences) and pass the padded array; a tf.RaggedTensor or tf.data of "
        "variable-length examples cannot be batched into one tensor a step either.")


def _shapes_that_differ(data) -> tuple[str, str]:
    """The first example's shape and the first that differs, as `example i has shape s`."""
    first = None
    for index, example in enumerate(data):
        try:
            shape = f"shape {np.shape(example)}"
        except ValueError:  # itself of different lengths inside
            shape = "rows of different lengths"
        if index == 0:
            first = shape
        elif shape != first:
            return f"example 0 has {first}", f"example {index} has {shape}"
    return f"example 0 has {first}", "another is of another kind"


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
