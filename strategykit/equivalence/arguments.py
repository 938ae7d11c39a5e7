"""The arguments of `sk.check`, checked up front: what is wrong, what was received, the fix."""

from __future__ import annotations

import math
import numbers

import keras

from strategykit.cluster.strategy_argument import check_strategy
from strategykit.equivalence import feeds
from strategykit.equivalence.precision import DTYPES
from strategykit.pinning.legacy_keras import check_not_keras_2


def check_model_fn(model_fn) -> None:
    """Raises ValueError unless `model_fn` is a function (not a model) to call twice."""
    check_not_keras_2(model_fn, "model_fn")
    if isinstance(model_fn, keras.layers.Layer) or not callable(model_fn):
        what = (f"a {type(model_fn).__name__} model" if isinstance(model_fn, keras.Model)
                else repr(model_fn) if model_fn is None or isinstance(model_fn, (int, str))
                else f"a {type(model_fn).__name__}")
        raise ValueError(
            "model_fn must be a function that builds and compiles a fresh model: sk.check "
            "calls it twice, for the 1-device run and inside the N-replica scope. "
            f"Received: model_fn={what}. Pass the code that builds your model as a "
            "function, e.g. sk.check(lambda: build_model(), data), where build_model() "
            "makes, compiles and returns a new keras.Model each call."
        )


def check_run(strategy, global_batch_size, steps, tolerance, epochs=2) -> None:
    """Raises ValueError for a `strategy`, batch, step or epoch count or tolerance not
    allowed."""
    if strategy is not None:
        check_strategy(strategy)
    examples = {"global_batch_size": 8, "steps": 3, "epochs": 2}
    for name, value in (("global_batch_size", global_batch_size), ("steps", steps),
                        ("epochs", epochs)):
        if (value is not None or name != "global_batch_size") and not _positive_int(value):
            raise ValueError(
                f"{name} must be a positive int. Received: {name}={value!r}. Pass e.g. "
                f"{name}={examples[name]}."
            )
    if (isinstance(tolerance, bool) or not isinstance(tolerance, numbers.Real)
            or not math.isfinite(tolerance) or tolerance < 0):
        raise ValueError(
            f"tolerance must be a finite number >= 0. Received: tolerance={tolerance!r}. "
            "Pass e.g. tolerance=1e-5 (the default), the largest difference accepted."
        )


def _positive_int(value) -> bool:
    return (not isinstance(value, bool) and isinstance(value, numbers.Integral)
            and value >= 1)


def check_options(dtype, accumulation) -> None:
    """Raises ValueError for a `dtype` or `gradient_accumulation_steps` not allowed."""
    if not (dtype is None or isinstance(dtype, str)) or dtype not in DTYPES:
        raise ValueError(
            f"dtype must be one of {DTYPES}. Received: dtype={dtype!r}. Use \"float64\" "
            "(default) for a verdict free of float32 rounding, \"float32\", or None to "
            "keep your global dtype policy."
        )
    if not _positive_int(accumulation):
        raise ValueError(
            f"gradient_accumulation_steps must be an int >= 1. Received: "
            f"gradient_accumulation_steps={accumulation!r}. Pass 1 (no accumulation) or "
            "the number of micro-steps per weight update, e.g. 4."
        )


def check_arguments(data, replicas, global_batch_size, steps, accumulation) -> None:
    """Raises ValueError for data or batches that do not fit the replicas and steps."""
    if global_batch_size % replicas:
        raise ValueError(
            f"global_batch_size={global_batch_size} does not divide evenly over {replicas} "
            f"replicas. Received: global_batch_size={global_batch_size}. Use a multiple "
            f"of {replicas}."
        )
    examples = feeds.examples(data)
    if examples < steps * accumulation * global_batch_size:
        names, values = "steps x global_batch_size", f"{steps} x {global_batch_size}"
        if accumulation > 1:
            names = "steps x gradient_accumulation_steps x global_batch_size"
            values = f"{steps} x {accumulation} x {global_batch_size}"
        raise ValueError(
            f"The data holds {examples} examples, fewer than {names} = {values}. Received: "
            f"steps={steps}, global_batch_size={global_batch_size}, "
            f"gradient_accumulation_steps={accumulation}. Pass more data, fewer steps or "
            "a smaller batch."
        )
