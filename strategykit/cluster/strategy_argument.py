"""The `strategy` argument of strategykit's functions, checked up front.

A `tf.distribute.Strategy`, or for the functions that default to the current one, None;
anything else (a replica count, a strategy's class, a device name) is refused with the
fix, before it fails deep inside TensorFlow with an `AttributeError`.
"""

from __future__ import annotations

import tensorflow as tf


def check_strategy(strategy, *, optional: bool = False) -> None:
    """Raises ValueError unless `strategy` is a `tf.distribute.Strategy` (or None, when
    `optional`).

    Example:
        >>> import tensorflow as tf
        >>> check_strategy(tf.distribute.get_strategy())
        >>> check_strategy(None, optional=True)
    """
    if isinstance(strategy, tf.distribute.Strategy) or (optional and strategy is None):
        return
    simple = strategy is None or isinstance(strategy, (int, float, str, type))
    what = repr(strategy) if simple else f"a {type(strategy).__name__}"
    default = " Or pass None for the current strategy." if optional else ""
    raise ValueError(
        f"strategy must be a tf.distribute.Strategy. Received: strategy={what}. Build one "
        "with sk.mirrored(replicas=N) or sk.from_env(), or pass tf.distribute.get_strategy() "
        f"for one device without a strategy.{default}"
    )
