"""Replica drift: how far each replica's copy of the weights has moved from replica 0's.

Weights updated by the all-reduced gradients stay equal on every replica, but an
unsynchronized `BatchNormalization` updates its moving statistics from each replica's
own batch: the copies drift apart, and saving keeps only replica 0's. This module
measures the largest divergence, finds non-finite copies, and averages the copies of
moving statistics so that a saved model holds the global statistics.
"""

from __future__ import annotations

import dataclasses

import keras
import numpy as np
import tensorflow as tf

from strategykit.callbacks import model_cache


def replica_copies(variable, strategy: tf.distribute.Strategy) -> list[np.ndarray]:
    """The value of each local replica's copy of a Keras variable."""
    return [np.asarray(copy) for copy in strategy.experimental_local_results(variable.value)]


@dataclasses.dataclass(frozen=True)
class CopiesReport:
    """What one pass over every replica's copy of every weight found.

    Attributes:
        drift: the largest absolute difference between a replica's copy of any weight
            and replica 0's (0.0 with one replica; NaN when a copy holds NaN).
        drift_path: the path of that weight, or None.
        non_finite: `(weight path, replica)` of each copy holding a NaN or an infinity.
    """

    drift: float
    drift_path: str | None
    non_finite: list


class CopyInspector:
    """Inspects every replica's copy of every weight of `model` in one traced call.

    Reading each copy from the host costs a round trip per copy (tens of milliseconds
    for a model with a hundred weights on four replicas); one `tf.function` computes
    all differences and finiteness flags on the devices and returns two small arrays.
    """

    def __init__(self, model: keras.Model):
        self.variables = list(model.weights)
        self.strategy = model.distribute_strategy
        # Plain Python loops over the weights: nothing for AutoGraph to convert.
        self._inspect = tf.function(self._differences_and_finite, autograph=False)

    @classmethod
    def of(cls, model: keras.Model) -> CopyInspector:
        """The inspector of `model`, traced once and kept while its weights stay the same."""
        return model_cache.cached(model, "copy_inspector", variables=model.weights,
                                  build=lambda: cls(model))

    def __call__(self) -> CopiesReport:
        if not self.variables:
            return CopiesReport(0.0, None, [])
        differences, finite = (t.numpy() for t in self._inspect())
        non_finite = [(self.variables[v].path, int(replica))
                      for v, replica in zip(*np.nonzero(~finite))]
        worst = int(np.argmax(np.where(np.isnan(differences), np.inf, differences).max(axis=1)))
        drift = float(differences[worst].max())  # NaN when a copy holds NaN
        return CopiesReport(drift, self.variables[worst].path if drift else None, non_finite)

    def _differences_and_finite(self):
        differences, finite = [], []
        for variable in self.variables:
            copies = [tf.cast(tf.convert_to_tensor(copy), tf.float64)
                      for copy in self.strategy.experimental_local_results(variable.value)]
            finite.append(tf.stack([tf.reduce_all(tf.math.is_finite(c)) for c in copies]))
            differences.append(tf.stack([tf.reduce_max(tf.abs(c - copies[0])) for c in copies]))
        return tf.stack(differences), tf.stack(finite)


def average_moving_statistics(model: keras.Model) -> int:
    """Replaces every replica's copy of each non-trainable float weight by their mean.

    For batch norm this makes the moving means exactly what one device would hold
    after a step on the global batch (equal shards, equal copies before it); the moving
    variances become the mean of the replicas' variances, which leaves out the spread
    of the replicas' batch means (use `sk.SyncBatchNormalization` for exact global
    statistics). Synchronized copies (all equal) are left untouched.

    Returns:
        The number of variables whose copies differed and were replaced.
    """
    changed = 0
    for variable in model.non_trainable_weights:
        if variable.dtype in ("float16", "bfloat16", "float32", "float64"):
            copies = np.stack(replica_copies(variable, model.distribute_strategy))
            changed += _assign_if_different(variable, copies, copies.mean(axis=0))
    return changed


def _assign_if_different(variable, copies, value) -> int:
    if np.all(copies == copies[0]):
        return 0
    variable.assign(value.astype(copies.dtype))
    return 1
