"""The batch of the step being traced, published to the layers the step calls.

Keras's step function (`train_step`, `test_step`, or a user's own) is wrapped with
`publishing(step)` (`strategykit.upstream.steps_per_execution` does it for every step
function Keras builds): while the step runs on a replica, `current()` is that replica's
`StepBatch`: its sample weight, which of its examples are real (`real`: False for a
padded copy, see `strategykit.batches.marks`), and, the first time it is asked, the
fraction of the step's examples over every replica that are real (one all-reduce).
Each replica of a `tf.distribute` strategy traces its step in a thread of its own, so
each sees its own batch. Outside a step `current()` is None.

Layers read it where one device's numbers depend on which examples are real:
synchronized batch norm takes its moments over the real examples only, activity
regularizers count the real examples only (`strategykit.batches.activity`), and
Keras's loss and metrics are corrected to the real examples
(`strategykit.upstream.exact_metrics`).
"""

from __future__ import annotations

import functools
import threading

import keras
import tensorflow as tf

from strategykit.batches.marks import real_examples

_published = threading.local()  # .step: this thread's StepBatch; .last: counts() cache


class StepBatch:
    """One replica's batch of the step being traced.

    Attributes:
        sample_weight: the step's sample weight (a nest, or None).
        real: a bool per example, False for a padded copy; None without sample weight.

    Example:
        >>> import tensorflow as tf
        >>> StepBatch(tf.constant([1.0, -0.0])).real.numpy().tolist()
        [True, False]
    """

    def __init__(self, sample_weight):
        self.sample_weight = sample_weight
        self.real = None if sample_weight is None else real_examples(sample_weight)
        self._graph = tf.compat.v1.get_default_graph()
        self._fraction = None

    def real_of(self, x: tf.Tensor) -> tf.Tensor | None:
        """`real` for a tensor `x` of the step whose first axis is the batch; None where
        the step has no sample weight, `x` is a scalar, or the static size of its first
        axis differs from the step's batch (a layer applied to something else)."""
        if self.real is None or x.shape.rank == 0:
            return None
        batch, examples = x.shape[0], self.real.shape[0]
        if batch is not None and examples is not None and batch != examples:
            return None
        return self.real

    def fraction(self) -> tf.Tensor:
        """The step's real examples over all its examples, over every replica (float32).

        One all-reduce, the first time it is asked in the step's own graph; every
        replica must ask it at the same point of the step (it is a collective).
        """
        in_own_graph = tf.compat.v1.get_default_graph() is self._graph
        if self._fraction is not None and in_own_graph:
            return self._fraction
        fraction = _fraction_of_real(self.real)
        if in_own_graph:
            self._fraction = fraction
        return fraction


def current() -> StepBatch | None:
    """The batch of the step this thread is tracing (or running eagerly), else None."""
    return getattr(_published, "step", None)


def publishing(step_function):
    """`step_function(data)`, publishing its batch to `current()` while it runs.

    Example:
        >>> import tensorflow as tf
        >>> step = publishing(lambda data: current().real)
        >>> step((tf.ones([2, 3]), tf.ones([2]), tf.constant([2.0, -0.0]))).numpy().tolist()
        [True, False]
        >>> current() is None
        True
    """

    @functools.wraps(step_function)
    def step(data):
        _, _, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        previous = current()
        _published.step = StepBatch(sample_weight)
        try:
            return step_function(data)
        finally:
            _published.step = previous

    return step


def counts(sample_weight):
    """`(real, fraction)` for `sample_weight` in replica context: its real-example mask,
    and the step's real examples over all its examples, over every replica.

    The published step's own when `sample_weight` is its sample weight (one all-reduce
    per step, shared with every other reader), else computed, and kept for the next call
    with the same `sample_weight` (a step of the user's own: its loss, then its metrics).
    """
    step = current()
    if step is not None and step.sample_weight is sample_weight:
        return step.real, step.fraction()
    last = getattr(_published, "last", None)
    if last is not None and last[0] is sample_weight:
        return last[1:]
    real = real_examples(sample_weight)
    fraction = _fraction_of_real(real)
    _published.last = (sample_weight, real, fraction)
    return real, fraction


def _fraction_of_real(real: tf.Tensor) -> tf.Tensor:
    local = tf.stack([tf.reduce_sum(tf.cast(real, tf.float32)),
                      tf.cast(tf.size(real), tf.float32)])
    context = tf.distribute.get_replica_context()
    total = local if context is None else context.all_reduce(
        tf.distribute.ReduceOp.SUM, local)
    return total[0] / total[1]
