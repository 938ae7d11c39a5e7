"""Whether N replicas' first update is one device's times a constant, for `sk.check`.

A training step whose loss is a per-replica batch mean written by hand (keras.io's VAE:
`ops.mean(...)` of its terms, gradients from the tape) is not scaled for distribution:
the replicas' gradients, summed by the all-reduce, are N times one device's, and so is
SGD's first update. A loss divided by the replicas twice gives 1/N. Both leave the
direction of the update as it is, so the first updates of the two runs are parallel:
`factor` finds the constant, and `sk.check` names it with its cause.

strategykit does not rescale such a step at run time: a per-replica mean that the step
scales itself later (or a sum meant as one) looks the same from outside, so it cannot
tell a wrong step from a right one, and it does not guess.
"""

from __future__ import annotations

import numpy as np

PARALLEL = 1e-6
"""Largest relative distance of the N-replica update from `factor` x one device's."""


def factor(initial: list, single: list, distributed: list, trainable: list) -> float | None:
    """`c` where the N-replica first update is `c` x one device's, else None.

    Args:
        initial: the weights both runs started from, as arrays.
        single, distributed: each run's weights after its first update, same order.
        trainable: whether each weight is trainable (only those are compared).

    Returns:
        The constant (e.g. 4.0 for a loss not scaled for 4 replicas), or None where the
        updates are not parallel, one device's update is zero, or the constant is 1.

    Example:
        >>> import numpy as np
        >>> start = [np.zeros(3)]
        >>> factor(start, [np.array([1.0, -2.0, 0.5])], [np.array([4.0, -8.0, 2.0])], [True])
        4.0
    """
    if not len(initial) == len(single) == len(distributed) == len(trainable):
        return None  # a model built in its first step: no weights to start from
    pairs = [(np.ravel(s) - np.ravel(i), np.ravel(d) - np.ravel(i))
             for i, s, d, t in zip(initial, single, distributed, trainable) if t]
    if not pairs:
        return None
    one = np.concatenate([p[0] for p in pairs]).astype("float64")
    many = np.concatenate([p[1] for p in pairs]).astype("float64")
    norm = float(one @ one)
    if norm == 0.0:
        return None
    constant = float(one @ many) / norm
    if abs(constant - 1.0) < 1e-3:
        return None
    if np.linalg.norm(many - constant * one) > PARALLEL * max(np.linalg.norm(many), 1e-300):
        return None
    return round(constant, 6)


def text(constant: float, replicas: int) -> str:
    """The report's line for an update `constant` x one device's, with its fix.

    Example:
        >>> text(4.0, 4).split(":")[0]
        "  the update is 4.00x one device's"
    """
    if abs(constant - replicas) < 1e-3 * replicas:
        cause = (f"the step's loss is a per-replica mean that is not scaled for {replicas} "
                 "replicas; use self.compute_loss(...) or multiply by "
                 "1/num_replicas_in_sync")
    elif abs(constant * replicas - 1) < 1e-3:
        cause = (f"the step's loss is scaled for {replicas} replicas twice; scale it once "
                 "(self.compute_loss(...) and Keras losses already are)")
    else:
        cause = "the step's loss is scaled by a constant that one device does not apply"
    return f"  the update is {constant:.2f}x one device's: {cause}"
