"""The NaN/Inf guard's pieces: the error, its message, and the weights before a step.

A non-finite loss on one replica poisons every replica at the next all-reduce, so to
end training with usable weights the guard needs the weights as they were *before* the
bad step. `WeightSnapshot` keeps them on the first replica's device: inside every train
step, before the model's own update, the first replica (of each machine) copies its
weights and the optimizer's variables into one flat buffer per dtype (one concat and
one assign; mirrored weights are equal on every replica, so one copy suffices).
Restoring writes them back to every replica's copy.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

ON_NAN = ("stop", "raise", "ignore")
"""The valid values of `on_nan`."""


class NonFiniteError(FloatingPointError):
    """A loss, weight or moving statistic became NaN or infinite on some replica."""


def check_on_nan(on_nan: str) -> None:
    """Raises a ValueError naming the valid choices when `on_nan` is not one."""
    if on_nan not in ON_NAN:
        raise ValueError(
            f"Unknown on_nan. Received: on_nan={on_nan!r}. Use one of "
            f"{', '.join(repr(o) for o in ON_NAN)}."
        )


def loss_message(values, *, epoch: int, batch: int, prefix: str = "",
                 replicas_per_worker: int | None = None) -> str | None:
    """Names the replicas whose loss is not finite, or returns None when all are.

    With `replicas_per_worker` (a job of several workers) each replica's worker is named
    too: replica `k` runs on worker `k // replicas_per_worker`.
    """
    bad = [k for k, value in enumerate(values) if not np.isfinite(value)]
    if not bad:
        return None
    where = (lambda k: f" on worker {k // replicas_per_worker}") if replicas_per_worker else (
        lambda k: "")
    shown = ", ".join(f"replica {k}{where(k)} ({values[k]})" for k in bad)
    return (
        f"Non-finite {prefix}loss on {shown} of {len(values)} at epoch {epoch}, batch "
        f"{batch}. Look at the data that replica received in that batch (each replica "
        "reads its own shard), or lower the learning rate."
    )


class WeightSnapshot:
    """The first replica's weights and optimizer variables before the latest step.

    Args:
        variables: the Keras variables to keep (model weights, optimizer variables).
        strategy: the model's distribution strategy.
    """

    def __init__(self, variables, strategy: tf.distribute.Strategy):
        self.groups: dict = {}
        for variable in variables:
            self.groups.setdefault(tf.as_dtype(variable.dtype), []).append(variable)
        local = strategy.experimental_local_results(variables[0].value)
        self._local_replicas = len(local)
        with tf.device(local[0].device):  # this machine's first replica's device
            self.buffers = {
                dtype: tf.Variable(
                    tf.zeros([sum(int(np.prod(v.shape)) for v in group)], dtype),
                    trainable=False,
                )
                for dtype, group in self.groups.items()
            }

    def take(self) -> None:
        """Copies the weights into the buffers; call in replica context, in the step."""
        replica = tf.get_static_value(
            tf.distribute.get_replica_context().replica_id_in_sync_group)
        if replica is not None and replica % self._local_replicas:
            return  # only each machine's first replica copies
        for dtype, group in self.groups.items():
            flat = [tf.reshape(tf.convert_to_tensor(v.value), [-1]) for v in group]
            self.buffers[dtype].assign(tf.concat(flat, axis=0))

    def restore(self) -> None:
        """Writes the kept values back into every replica's copy of each variable."""
        for dtype, group in self.groups.items():
            flat = self.buffers[dtype].numpy()
            offset = 0
            for variable in group:
                size = int(np.prod(variable.shape))
                variable.assign(flat[offset:offset + size].reshape(variable.shape))
                offset += size
