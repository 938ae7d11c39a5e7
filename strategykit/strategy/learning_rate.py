"""`scale_learning_rate()`: the learning rate for a larger global batch.

Moving from 1 device to N replicas (or adding gradient accumulation) multiplies the
examples per update. A recipe tuned at a base batch then needs its learning rate scaled:
linearly (Goyal et al. 2017, "Accurate, Large Minibatch SGD: Training ImageNet in 1
Hour") or by the square root (Krizhevsky 2014, "One weird trick for parallelizing
convolutional neural networks"). Warmup is Keras's own: scale the rate a schedule warms
up to, e.g. `CosineDecay(warmup_target=...)`.
"""

from __future__ import annotations

import math
import numbers

RULES = ("linear", "sqrt")
"""The valid values of `scale_learning_rate(rule=...)`."""


def scale_learning_rate(
    base_lr: float,
    global_batch_size: int,
    *,
    base_batch_size: int,
    rule: str = "linear",
) -> float:
    """Scales a learning rate tuned at `base_batch_size` to `global_batch_size`.

    `"linear"` returns `base_lr * global_batch_size / base_batch_size` (Goyal et al.
    2017: with k times the examples per update, take k times the step; pair it with a
    warmup). `"sqrt"` returns `base_lr * sqrt(global_batch_size / base_batch_size)`
    (Krizhevsky 2014: keeps the variance of the update constant; often better for Adam).

    `base_batch_size` has no default on purpose: it is the batch *your* `base_lr` was
    tuned at (256 in Goyal et al.'s ImageNet recipe, often 8-32 in segmentation), and a
    wrong guess silently scales the rate by the wrong factor. The global batch counts
    every example of one update: replicas x per-replica batch x gradient accumulation
    steps.

    It takes and returns a number. For a schedule, scale the rate it warms up to and
    let Keras do the warmup (Goyal et al. warm up linearly from `base_lr` over the
    first ~5 epochs):
    `keras.optimizers.schedules.CosineDecay(initial_learning_rate=base_lr,
    decay_steps=..., warmup_target=scale_learning_rate(base_lr, ...),
    warmup_steps=...)`.

    Args:
        base_lr: the learning rate tuned at `base_batch_size`, a positive number.
        global_batch_size: examples per weight update now, a positive int.
        base_batch_size: examples per weight update `base_lr` was tuned at, a positive
            int. Required.
        rule: `"linear"` (default) or `"sqrt"`.

    Returns:
        The scaled learning rate, a float.

    Raises:
        ValueError: `base_lr` is not a positive finite number (a schedule included),
            a batch size is not a positive int, or `rule` is not in `RULES`.

    Example:
        >>> import keras, strategykit as sk
        >>> sk.scale_learning_rate(0.1, global_batch_size=1024, base_batch_size=256)
        0.4
        >>> sk.scale_learning_rate(0.1, 1024, base_batch_size=256, rule="sqrt")
        0.2
        >>> peak = sk.scale_learning_rate(0.1, global_batch_size=1024, base_batch_size=256)
        >>> schedule = keras.optimizers.schedules.CosineDecay(
        ...     initial_learning_rate=0.1, decay_steps=9_000, warmup_target=peak,
        ...     warmup_steps=1_000)  # 0.1 -> 0.4 over 1,000 steps, then cosine to 0
        >>> [round(float(schedule(step)), 4) for step in (0, 500, 1_000, 10_000)]
        [0.1, 0.25, 0.4, 0.0]
    """
    _check_number("base_lr", base_lr)
    _check_batch_size("global_batch_size", global_batch_size)
    _check_batch_size("base_batch_size", base_batch_size)
    if not isinstance(rule, str) or rule not in RULES:
        raise ValueError(
            f"rule must be one of {RULES}. Received: rule={rule!r}. Use \"linear\" "
            "(Goyal et al. 2017) or \"sqrt\" (Krizhevsky 2014)."
        )
    ratio = int(global_batch_size) / int(base_batch_size)
    return float(base_lr) * (ratio if rule == "linear" else math.sqrt(ratio))


def _check_number(name: str, value) -> None:
    if (isinstance(value, bool) or not isinstance(value, numbers.Real)
            or not math.isfinite(value) or value <= 0):
        raise ValueError(
            f"{name} must be a positive number. Received: {name}={value!r}. Pass the "
            "learning rate your recipe uses at base_batch_size; for a schedule, scale "
            "the rate it warms up to: CosineDecay(initial_learning_rate=base_lr, ..., "
            "warmup_target=sk.scale_learning_rate(base_lr, ...), warmup_steps=...)."
        )


def _check_batch_size(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
        raise ValueError(
            f"{name} must be a positive int. Received: {name}={value!r}. Pass the number "
            "of examples per weight update (replicas x per-replica batch x gradient "
            "accumulation steps), e.g. 256."
        )
