"""The arguments of `sk.check`, checked up front: what is wrong, what was received, the fix."""

from __future__ import annotations

from strategykit.equivalence import feeds
from strategykit.equivalence.precision import DTYPES


def check_options(dtype, accumulation) -> None:
    """Raises ValueError for a `dtype` or `gradient_accumulation_steps` not allowed."""
    if not (dtype is None or isinstance(dtype, str)) or dtype not in DTYPES:
        raise ValueError(
            f"dtype must be one of {DTYPES}. Received: dtype={dtype!r}. Use \"float64\" "
            "(default) for a verdict free of float32 rounding, \"float32\", or None to "
            "keep your global dtype policy."
        )
    if isinstance(accumulation, bool) or not isinstance(accumulation, int) or accumulation < 1:
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
