"""The precision of `sk.check`: both runs in float64, the user's dtype policy restored.

`check` builds and trains both models under the global dtype policy it is given
(`"float64"` by default) and with Keras's `floatx` set alike, casts floating-point data to
it, and restores the user's settings afterwards, also when it raises. Layers that pin
their own dtype keep it; they are found here and reported.

Why `floatx` too: the dtype policy decides the layers' dtype, `floatx` that of the
compiled loss (a `keras.losses.Loss` takes `floatx` when built without a dtype) and of
what Keras adds to it: a float32 loss next to float64 regularization terms fails in
`compute_loss` (`TypeError: Cannot convert a list containing a tensor of dtype float64
to float32`, Keras 3.8 to 3.15), and a float32 loss would round every gradient to float32.
"""

from __future__ import annotations

import contextlib
import warnings

import keras
import numpy as np
import tensorflow as tf

from strategykit.batchnorm.nested_layers import every_layer, flat_layers
from strategykit.data.own_functions import traced_as_written

DTYPES = ("float64", "float32", None)
"""The valid values of `check(dtype=...)`."""


@contextlib.contextmanager
def global_dtype(dtype: str | None):
    """Sets Keras's global dtype policy and `floatx` to `dtype` inside; restores both
    afterwards. Nothing changes for None.

    Example:
        >>> import keras
        >>> with global_dtype("float64"):
        ...     keras.losses.MeanSquaredError().dtype, keras.layers.Dense(1).dtype
        ('float64', 'float64')
        >>> keras.config.floatx()
        'float32'
    """
    if dtype is None:
        yield
        return
    previous_policy, previous_floatx = keras.config.dtype_policy(), keras.config.floatx()
    keras.config.set_dtype_policy(dtype)
    keras.config.set_floatx(dtype)
    try:
        yield
    finally:
        keras.config.set_floatx(previous_floatx)
        keras.config.set_dtype_policy(previous_policy)


def cast_floats(data, dtype: str | None):
    """`data` with its floating-point arrays cast to `dtype` (integer labels kept)."""
    if dtype is None:
        return data

    def cast(array):
        array = np.asarray(array)
        return array.astype(dtype) if np.issubdtype(array.dtype, np.floating) else array

    return tf.nest.map_structure(cast, data)


def cast_floats_of_dataset(dataset: tf.data.Dataset, dtype: str | None) -> tf.data.Dataset:
    """`dataset` with its floating-point tensors cast to `dtype` (as `cast_floats`)."""
    if dtype is None:
        return dataset

    def cast(*element):
        element = element[0] if len(element) == 1 else element
        return tf.nest.map_structure(
            lambda t: tf.cast(t, dtype) if t.dtype.is_floating else t, element)

    return dataset.map(traced_as_written(cast))


def cast_regularizers(model: keras.Model, dtype: str | None) -> None:
    """Casts the floating-point tensors the regularizers of `model` hold to `dtype`.

    Keras's `L1` and `OrthogonalRegularizer` hold their factor as a float32 tensor
    whatever `floatx` (`ops.convert_to_tensor(l1)`), and before Keras 3.14 multiply it
    by the weights or activations as it is: `TypeError: Input 'y' of 'Mul' Op has type float64 that
    does not match type float32` in a float64 check (Keras 3.8 to 3.13). Weight
    regularizers (`variable.regularizer`) and activity regularizers, of nested layers
    too, are changed in place on these models only; nothing changes for None.

    Example:
        >>> import keras
        >>> dense = keras.layers.Dense(1, activity_regularizer=keras.regularizers.L1(0.1))
        >>> model = keras.Sequential([keras.Input((2,)), dense])
        >>> cast_regularizers(model, "float64")
        >>> keras.backend.standardize_dtype(dense.activity_regularizer.l1.dtype)
        'float64'
    """
    if dtype is None:
        return
    found = [weight.regularizer for weight in model.weights]
    found += [getattr(layer, "activity_regularizer", None)
              for _, layer in every_layer(model)]
    for regularizer in {id(r): r for r in found if r is not None}.values():
        for name, value in vars(regularizer).items():
            if tf.is_tensor(value) and value.dtype.is_floating and value.dtype != dtype:
                setattr(regularizer, name, tf.cast(value, dtype))


def other_dtype_layers(model: keras.Model, dtype: str | None) -> dict:
    """Layers computing or keeping weights in a floating dtype other than `dtype`.

    Warns when there are any: their rounding stays.

    Raises:
        ValueError: some weights are in `dtype` and others are not. tf.distribute's
            batched all-reduce (ring, hierarchical copy) packs every gradient into one
            tensor and fails on mixed dtypes (checked on TF 2.21).
    """
    if dtype is None:
        return {}
    found = {
        name: layer.dtype_policy.name for name, layer in flat_layers(model)
        if not isinstance(layer, keras.layers.InputLayer)
        and any(keras.backend.is_float_dtype(d) and d != dtype
                for d in (layer.compute_dtype, layer.variable_dtype))
    }
    weight_dtypes = {w.dtype for w in model.weights if keras.backend.is_float_dtype(w.dtype)}
    if len(weight_dtypes) > 1:
        pinned = [name for name, layer in flat_layers(model)
                  if any(w.dtype != dtype for w in layer.weights)]
        raise ValueError(
            f"sk.check builds the model in {dtype}, but layers {pinned[:3]}"
            f"{' and more' if len(pinned) > 3 else ''} pin weights in another dtype, and "
            f"tf.distribute cannot all-reduce gradients of mixed dtypes. Received: "
            f"dtype={dtype!r}, weights in {sorted(weight_dtypes)}. Build those layers "
            "without dtype= inside model_fn, or pass dtype=None to check in your own "
            "dtype policy (its rounding may then decide the verdict on deep nets)."
        )
    if found:
        warnings.warn(other_dtypes_text(found, dtype), stacklevel=3)
    return found


def other_dtypes_text(layers: dict, dtype: str) -> str:
    shown = ", ".join(f"{name} ({policy})" for name, policy in list(layers.items())[:3])
    more = f" and {len(layers) - 3} more" if len(layers) > 3 else ""
    return (
        f"sk.check compared in {dtype}, but {len(layers)} layers pin their own dtype: "
        f"{shown}{more}. Their rounding can decide the verdict on deep nets. Build the "
        "model inside model_fn without an explicit dtype (configs of loaded or cloned "
        "models carry theirs)."
    )
