"""`sk.reduce`: one value from per-replica values, with the reductions tf.distribute lacks.

`tf.distribute.Strategy.reduce` knows only `SUM` and `MEAN`. Custom training loops also
want to see how replicas differ: the smallest and largest loss, their spread. `reduce`
takes what `strategy.run` returned and applies `"mean"`, `"sum"`, `"min"`, `"max"` or
`"std"` across replicas, element by element.

Loss scaling in a custom loop (the recipe `fit()` follows): each replica divides the sum
of its per-example losses by the **global** batch size, so that the gradients, summed by
the all-reduce, are those of the mean over the global batch. `SUM_OVER_BATCH_SIZE`
(the per-replica mean) would make them N times too large::

    GLOBAL_BATCH = 64

    def step(x, y):
        with tf.GradientTape() as tape:
            per_example = loss_fn(y, model(x, training=True))   # reduction="none"
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=GLOBAL_BATCH)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss, tf.reduce_mean(per_example)

    scaled, replica_means = strategy.run(step, args=next(iterator))
    global_loss = sk.reduce(scaled, strategy, "sum")        # mean over the global batch
    worst = sk.reduce(replica_means, strategy, "max")       # the worst replica's mean loss

`tests/strategy/test_reduction.py` runs this recipe on 4 replicas against one device.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
import tensorflow.experimental.numpy as tnp

from strategykit.cluster.roles import is_multi_worker
from strategykit.cluster.strategy_argument import check_strategy

REDUCE_OPS = ("mean", "sum", "min", "max", "std")
"""The valid values of `op`."""


def reduce(per_replica, strategy: tf.distribute.Strategy, op: str = "mean"):
    """Reduces per-replica values across replicas, element by element.

    Call it in cross-replica context (outside `strategy.run`), eagerly or inside a
    `tf.function`. `"std"` is the population standard deviation (like `numpy.std`).
    Across several workers it reduces over every replica of the job, and every worker
    gets the same result (so every worker must call it, as with any collective).

    Args:
        per_replica: what `strategy.run` returned: a `tf.distribute.DistributedValues`,
            a tensor (one replica), or a nest (dict, list, tuple) of them.
        strategy: the strategy that produced the values.
        op: `"mean"` (default), `"sum"`, `"min"`, `"max"` or `"std"`.

    Returns:
        A tensor (or the same nest of tensors) with the shape of one replica's value.

    Raises:
        ValueError: an unknown `op`, or `strategy` not a `tf.distribute.Strategy`.

    Example:
        >>> import strategykit as sk, tensorflow as tf
        >>> strategy = sk.mirrored(replicas=2)  # doctest: +SKIP
        >>> values = strategy.run(
        ...     lambda: tf.cast(tf.distribute.get_replica_context().replica_id_in_sync_group,
        ...                     tf.float32) * 10.0)  # doctest: +SKIP
        >>> float(sk.reduce(values, strategy, "max"))  # doctest: +SKIP
        10.0
    """
    check_strategy(strategy)
    check_op(op)

    def reduce_one(value):
        return reduce_stacked(every_replica(value, strategy), op, xp=tnp)

    return tf.nest.map_structure(reduce_one, per_replica)


def every_replica(value, strategy) -> tf.Tensor:
    """Every replica's value stacked along a new axis 0, in replica order over the job.

    `value` is what `strategy.run` returned. Across several workers the other workers'
    replicas are gathered (a collective: every worker must call it alike); there a plain
    tensor, one value per worker, counts once for each of its worker's replicas. On one
    machine its replicas are all local.

    Example:
        >>> import tensorflow as tf, strategykit as sk
        >>> from strategykit.strategy.reduction import every_replica
        >>> strategy = sk.mirrored(["/cpu:0"])
        >>> every_replica(strategy.run(lambda: tf.constant(3)), strategy).numpy()
        array([3], dtype=int32)
    """
    local = [tf.expand_dims(v, 0) for v in strategy.experimental_local_results(value)]
    if not is_multi_worker(strategy):
        return tf.concat(local, axis=0)
    distributed = strategy.experimental_distribute_values_from_function(
        lambda context: local[context.replica_id_in_sync_group % len(local)])
    return strategy.gather(distributed, axis=0)


def check_op(op: str) -> None:
    """Raises a ValueError naming the valid reductions when `op` is not one."""
    if op not in REDUCE_OPS:
        raise ValueError(
            f"Unknown reduction. Received: op={op!r}. Use one of "
            f"{', '.join(repr(o) for o in REDUCE_OPS)}."
        )


def reduce_stacked(stacked, op: str, *, weights=None, xp=np):
    """Reduces along axis 0 (the replicas); the one implementation of every reduction.

    Args:
        stacked: replica values stacked along axis 0 (numpy array or tensor).
        op: one of `REDUCE_OPS`.
        weights: optional weight of each replica (shape `[replicas]`) for `"mean"` and
            `"std"`, e.g. its example count. Default: equal weights.
        xp: `numpy` for host arrays (the callbacks) or `tf.experimental.numpy` for
            tensors (`reduce`).
    """
    if op == "sum":
        return xp.sum(stacked, axis=0)
    if op == "min":
        return xp.min(stacked, axis=0)
    if op == "max":
        return xp.max(stacked, axis=0)
    mean = _mean(stacked, weights, xp)
    if op == "mean":
        return mean
    return xp.sqrt(_mean((stacked - mean) ** 2, weights, xp))


def _mean(stacked, weights, xp):
    if weights is None:
        return xp.mean(stacked, axis=0)
    weights = xp.reshape(weights, (-1,) + (1,) * (len(stacked.shape) - 1))
    return xp.sum(stacked * weights, axis=0) / xp.sum(weights)
