"""The compiled metrics of the two runs of `check()`, evaluated after their steps.

Equal weights are not the whole story: the numbers Keras reports must agree too. After
both runs, each model evaluates every example of the check's data, one device in batches
of the global batch size, N replicas on `sk.shard` data (its final partial batch
padded), and every value `evaluate()` returns (the loss, each metric) is compared.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from strategykit.data.sharding import shard


def evaluate_both(single: keras.Model, distributed: keras.Model, data, *,
                  strategy: tf.distribute.Strategy, global_batch_size: int):
    """`(one device's, N replicas')` `evaluate()` values on all of `data`, by name."""
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
