"""The compiled metrics of the two runs of `check()`, evaluated after their steps.

Equal weights are not the whole story: the numbers Keras reports must agree too. After
both runs, each model evaluates the examples of the steps and half a global batch more
(so that, as at the end of most data, the final batch is partial: padded under N
replicas), one device in batches of the global batch size, N replicas on `sk.shard`
data, and every value `evaluate()` returns (the loss, each metric) is compared. Not all
of the data: a check on a large dataset stays as quick as its steps.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from strategykit.data.sharding import shard


def evaluation_examples(data, trained: int, global_batch_size: int):
    """The first `trained + global_batch_size // 2 + 1` examples of `data` (all, if fewer).

    Example:
        >>> import numpy as np
        >>> x, y = evaluation_examples((np.arange(100), np.arange(100)), 24, 8)
        >>> len(x), len(y)
        (29, 29)
    """
    count = trained + global_batch_size // 2 + 1
    return tf.nest.map_structure(lambda array: array[:count], data)


def evaluate_both(single: keras.Model, distributed: keras.Model, data, *,
                  strategy: tf.distribute.Strategy, global_batch_size: int):
    """`(one device's, N replicas')` `evaluate()` values on `data`, by name."""
    x, y = data
    expected = single.evaluate(x, y, batch_size=global_batch_size, verbose=0,
                               return_dict=True)
    sharded = shard((x, y), strategy, global_batch_size=global_batch_size)
    return _floats(expected), _floats(distributed.evaluate(sharded, verbose=0,
                                                           return_dict=True))


def differences(single: dict, distributed: dict) -> dict:
    """`{name: absolute difference}` of every value both runs report."""
    return {name: abs(single[name] - distributed[name]) for name in single if name in distributed}


def first_differing(single: dict, metric_differences: dict, tolerance: float) -> str | None:
    """The first metric, in Keras's order, differing by more than `tolerance` (relative
    to the metric when it is larger than 1); None when every one agrees."""
    for name, difference in metric_differences.items():
        if not difference <= tolerance * max(1.0, abs(single[name])):  # NaN differs
            return name
    return None


def _floats(values: dict) -> dict:
    return {name: float(value) for name, value in values.items()}
