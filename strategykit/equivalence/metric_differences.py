"""Every number the two runs of `check()` report: `fit()`'s and `evaluate()`'s.

Equal weights are not the whole story: the numbers Keras reports must agree too. Those
`fit()` returned after the steps (its History: the loss and each metric, or whatever a
custom `train_step` returns) are compared, and then each model evaluates the examples of
the steps and half a global batch more (so that, as at the end of most data, the final
batch is partial: padded under N replicas), fed as `fit()` was, and every value
`evaluate()` returns is compared too. Not all of the data: a check on a large dataset
stays as quick as its steps.

A step that reports a loss scaled for distribution (divided by the replicas, as
`tf.nn.compute_average_loss` does for the gradients) reports 1/N of one device's on N
replicas, however right its gradients: found here and named as such.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from strategykit.equivalence import feeds


def evaluation_size(trained: int, global_batch_size: int) -> int:
    """How many examples `evaluation_examples` takes: those of the steps and a partial
    final batch more."""
    return trained + global_batch_size // 2 + 1


def evaluation_examples(data, trained: int, global_batch_size: int):
    """The first `evaluation_size(trained, global_batch_size)` examples of `data` (all, if
    fewer).

    Example:
        >>> import numpy as np
        >>> x, y = evaluation_examples((np.arange(100), np.arange(100)), 24, 8)
        >>> len(x), len(y)
        (29, 29)
    """
    return feeds.head(data, evaluation_size(trained, global_batch_size))


def evaluate_one_device(single: keras.Model, data, global_batch_size: int) -> dict:
    """One device's `evaluate()` values on `data`, by name."""
    return floats(single.evaluate(**feeds.one_device(data, global_batch_size), verbose=0,
                                  return_dict=True))


def evaluate_replicas(distributed: keras.Model, data, *, strategy: tf.distribute.Strategy,
                      global_batch_size: int) -> dict:
    """N replicas' `evaluate()` values on `sk.shard` data of `data`, by name."""
    return floats(distributed.evaluate(**feeds.replicas(data, strategy, global_batch_size),
                                       verbose=0, return_dict=True))


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


def scaled_for_distribution(single: float, distributed: float, replicas: int) -> bool:
    """Whether `distributed` is 1/`replicas` of `single` (to 0.1%), as a loss divided by
    the replicas and reported is.

    Example:
        >>> scaled_for_distribution(1.32, 0.33, 4), scaled_for_distribution(1.32, 1.32, 4)
        (True, False)
    """
    return replicas > 1 and single != 0 and abs(distributed * replicas / single - 1) < 1e-3


def floats(values: dict) -> dict:
    """`values` as Python floats (a History's: the last of each list)."""
    return {name: float(value[-1] if isinstance(value, list) else value)
            for name, value in values.items()}
