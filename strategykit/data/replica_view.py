"""What each replica receives of a distributed dataset, step by step: `replica_batches`.

For docs, notebooks and tests: the first input's values per step and replica, without
the padded copies that `sk.shard` adds to a final partial batch (weight -0.0).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from strategykit.batches.marks import real_examples
from strategykit.cluster.strategy_argument import check_strategy
from strategykit.data import position
from strategykit.data.batching import split_labels
from strategykit.data.sharding import global_batch_size_of


def replica_batches(ds, strategy: tf.distribute.Strategy, steps: int | None = None, *,
                    padding: bool = False, epoch: int | None = None) -> list:
    """What each replica receives: per step, per replica, the values of the first input.

    Args:
        ds: a distributed dataset, e.g. from `sk.shard`.
        strategy: its strategy.
        steps: steps to read. Default: all (one epoch).
        padding: include padded examples (sample weight -0.0). Default False.
        epoch: the epoch of `fit()` to show (it keys `sk.shard`'s shuffle order with a
            seed). Default None: the epoch of the last `fit()`, 0 before any.

    Returns:
        A list over steps of lists over replicas of lists of values (the first tensor of
        `x`, as Python values), e.g. example ids.

    Example:
        >>> import numpy as np, strategykit as sk
        >>> strategy = sk.mirrored(replicas=2)  # doctest: +SKIP
        >>> ids = np.arange(10)
        >>> ds = sk.shard((ids, ids), strategy, global_batch_size=4)  # doctest: +SKIP
        >>> sk.replica_batches(ds, strategy, steps=2)  # doctest: +SKIP
        [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]
    """
    check_strategy(strategy)
    if not isinstance(ds, (tf.distribute.DistributedDataset, tf.data.Dataset)):
        raise ValueError(
            "ds must be a distributed dataset, such as sk.shard makes. Received: ds of type "
            f"{type(ds).__name__}. Pass sk.shard(data, strategy, global_batch_size=...).")
    if epoch is not None:
        position.set_epoch(epoch)
    weighted = global_batch_size_of(ds) is not None
    result = []
    for step, element in enumerate(ds):
        if steps is not None and step >= steps:
            break
        x, y, weight = split_labels(element) if weighted else (element, None, None)
        values = strategy.experimental_local_results(tf.nest.flatten(x)[0])
        weights = (strategy.experimental_local_results(weight) if weight is not None
                   else [None] * len(values))
        result.append([_real_values(v, w, padding) for v, w in zip(values, weights)])
    return result


def _real_values(values, weights, padding):
    values = np.asarray(values)
    if weights is not None and not padding:
        # By the padding mark (-0.0), not by weight: an example you weighed 0 is real
        values = values[real_examples(weights).numpy()]
    return values.tolist()
