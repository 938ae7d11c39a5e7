"""Mean and variance over the global batch, with one all-reduce and a sound variance.

Each replica computes, per channel, its example count `n_i`, its mean `m_i` and the sum
of squared deviations from that mean `M2_i` (two passes over its own data, so no
cancellation). One all-reduce (SUM) of a `[replicas, 2C + 1]` tensor, in which each
replica fills only its own row, gives every replica every row. The rows are then
combined with the parallel formula of Chan, Golub and LeVeque (1979):

    n    = sum n_i
    mean = sum n_i m_i / n
    M2   = sum M2_i + sum n_i (m_i - mean)^2
    var  = M2 / n

A replica with `n_i = 0` (an uneven last batch) adds nothing. Unlike the textbook
`E[x^2] - E[x]^2` (which Keras's `synchronized=True` uses), this keeps full precision
when the mean is large against the spread: data with mean 1e4 and standard deviation 1
loses every significant digit of the variance in float32 with `E[x^2] - E[x]^2`.

The gradient is written by hand (`tf.custom_gradient`) rather than differentiated
through the formula: since d mean / dx = 1/n and d var / dx = 2 (x - mean) / n for every
example of every replica, the backward pass needs one all-reduce of the `[2, C]`
upstream gradients and one elementwise expression. Per layer and step that makes one
collective forward and one backward, against three and two for Keras's
`synchronized=True`; on small activations the collectives are most of the cost.
"""

from __future__ import annotations

import tensorflow as tf

from strategykit.batches import current_step


def local_moments(x: tf.Tensor, axes: list[int], mask: tf.Tensor | None = None):
    """Count, mean and sum of squared deviations of `x` over `axes`, mask-aware.

    Args:
        x: a float tensor.
        axes: the axes reduced (every axis but the channel axis).
        mask: optional boolean tensor broadcastable to `x`; False entries are left out.
            Where it is all True (a full batch) the moments are taken unmasked.

    Returns:
        `(count, mean, m2)`: `count` a scalar, `mean` and `m2` of shape `[C]` (the
        dimensions of `x` not in `axes`). With `count == 0` both are zeros.
    """
    if mask is None:
        return _unmasked_moments(x, axes)
    return tf.cond(tf.reduce_all(mask), lambda: _unmasked_moments(x, axes),
                   lambda: _masked_moments(x, axes, mask))


def _unmasked_moments(x, axes):
    count = tf.cast(tf.reduce_prod(tf.gather(tf.shape(x), axes)), x.dtype)
    mean = tf.math.divide_no_nan(tf.reduce_sum(x, axis=axes), count)
    deviations = x - _keep_axes(mean, x, axes)
    return count, mean, tf.reduce_sum(tf.square(deviations), axis=axes)


def _masked_moments(x, axes, mask):
    weights = tf.cast(tf.broadcast_to(mask, tf.shape(x)), x.dtype)
    # Every channel of an example shares its mask, so one count serves all channels.
    count = tf.reduce_max(tf.reduce_sum(weights, axis=axes))
    mean = tf.math.divide_no_nan(tf.reduce_sum(x * weights, axis=axes), count)
    deviations = (x - _keep_axes(mean, x, axes)) * weights
    return count, mean, tf.reduce_sum(tf.square(deviations), axis=axes)


def combine_moments(counts: tf.Tensor, means: tf.Tensor, m2s: tf.Tensor):
    """Combines per-replica moments with Chan et al.'s parallel formula.

    Args:
        counts: `[R]` example counts.
        means: `[R, C]` per-replica means.
        m2s: `[R, C]` per-replica sums of squared deviations from their own mean.

    Returns:
        `(mean, variance)` of the union, each `[C]`; zeros when every count is 0.
    """
    total = tf.reduce_sum(counts)
    weights = counts[:, None]
    mean = tf.math.divide_no_nan(tf.reduce_sum(weights * means, axis=0), total)
    spread = tf.reduce_sum(weights * tf.square(means - mean), axis=0)
    variance = tf.math.divide_no_nan(tf.reduce_sum(m2s, axis=0) + spread, total)
    return mean, variance


def cross_replica_moments(
    x: tf.Tensor,
    axes: list[int],
    mask: tf.Tensor | None = None,
    replica_context: tf.distribute.ReplicaContext | None = None,
):
    """Mean and variance of `x` over `axes` and over every replica, in one all-reduce.

    Differentiable; its gradient costs one more all-reduce. Must be called by every
    replica of the step, the same number of times (it is a collective: a replica that
    skips it makes the others wait forever).

    Args:
        x: this replica's float tensor; float32 or wider (cast before calling).
        axes: the axes reduced (every axis but the channel axis).
        mask: optional boolean tensor broadcastable to `x`; False entries are left out.
        replica_context: the replica context. Default: `tf.distribute.get_replica_context()`.

    Returns:
        `(mean, variance)`, each of shape `[C]`, identical on every replica.

    Example:
        >>> import tensorflow as tf
        >>> from strategykit.batches.moments import cross_replica_moments
        >>> x = tf.constant([[1.0], [3.0]])
        >>> [t.numpy().tolist() for t in cross_replica_moments(x, [0])]
        [[2.0], [1.0]]
    """
    context = replica_context or tf.distribute.get_replica_context()
    replicas = context.num_replicas_in_sync if context is not None else 1
    if replicas == 1:
        count, mean, m2 = local_moments(x, axes, mask)
        return mean, tf.math.divide_no_nan(m2, count)

    @tf.custom_gradient
    def moments(x):
        count, mean, m2 = local_moments(x, axes, mask)
        row = tf.concat([count[None], mean, m2], axis=0)
        own_row = tf.one_hot(context.replica_id_in_sync_group, replicas, dtype=x.dtype)
        rows = context.all_reduce(tf.distribute.ReduceOp.SUM, own_row[:, None] * row[None, :])
        channels = tf.shape(mean)[0]
        counts = rows[:, 0]
        global_mean, variance = combine_moments(
            counts, rows[:, 1 : 1 + channels], rows[:, 1 + channels :])

        def grad(d_mean, d_variance):
            # d mean / d x = 1 / n and d var / d x = 2 (x - mean) / n for every example
            # of every replica, so each replica needs the sum over replicas of the
            # upstream gradients: one all-reduce of [2, C], instead of differentiating
            # through the formula above.
            d_mean = tf.zeros_like(global_mean) if d_mean is None else d_mean
            d_variance = tf.zeros_like(variance) if d_variance is None else d_variance
            summed = context.all_reduce(
                tf.distribute.ReduceOp.SUM, tf.stack([d_mean, d_variance]))
            summed = tf.math.divide_no_nan(summed, tf.reduce_sum(counts))
            d_x = _keep_axes(summed[0], x, axes) + 2.0 * (
                x - _keep_axes(global_mean, x, axes)) * _keep_axes(summed[1], x, axes)
            if mask is None:
                return d_x
            return tf.cond(tf.reduce_all(mask), lambda: d_x,
                           lambda: d_x * tf.cast(mask, x.dtype))

        return (global_mean, variance), grad

    return moments(x)


def over_real_examples(x: tf.Tensor, mask: tf.Tensor | None = None) -> tf.Tensor | None:
    """`mask` narrowed to the real examples of the step being traced (`current_step`).

    A padded copy of `sk.shard`'s final batch is left out of the moments, as one device
    never sees it. The first axis of `x` is taken as the batch, unless its static size
    differs from the step's batch (a layer applied to something else).

    Args:
        x: this replica's float tensor, batch first.
        mask: a boolean tensor broadcastable to `x`, or None.

    Returns:
        A boolean tensor broadcastable to `x`, or `mask` itself where no step is
        published or its batch has no sample weights (every example is then real).

    Example:
        >>> import tensorflow as tf
        >>> from strategykit.batches import current_step
        >>> x, y = tf.constant([[1.0], [3.0], [3.0]]), tf.zeros([3])
        >>> step = current_step.publishing(lambda data: over_real_examples(data[0]))
        >>> step((x, y, tf.constant([1.0, 1.0, -0.0]))).numpy().ravel().tolist()
        [True, True, False]
    """
    step = current_step.current()
    real = None if step is None else step.real_of(x)
    if real is None:
        return mask
    real = tf.reshape(real, [-1] + [1] * (len(x.shape) - 1))
    return real if mask is None else tf.logical_and(tf.cast(mask, tf.bool), real)


def _keep_axes(stat: tf.Tensor, x: tf.Tensor, axes: list[int]) -> tf.Tensor:
    """Reshapes a `[C]` statistic so it broadcasts against `x` (1 on every reduced axis)."""
    shape = [1 if axis in axes else -1 for axis in range(len(x.shape))]
    return tf.reshape(stat, shape)
