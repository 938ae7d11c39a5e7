"""`sk.shard`'s numbers, checked before any data is read: batch size, seed, buffer, size.

tf.data takes each of them as an int64 or int32 tensor and reports a wrong one deep in
its ops (`Expected int64, but got abc`, an int32 `Less` op fed an int64), or not at all
(a shuffle buffer of 0 read as "unset"). Each check here names the argument, what was
received and the fix.
"""

from __future__ import annotations

import warnings

import numpy as np

INT32_MAX = 2**31 - 1  # tf.data's batch sizes and indices are int32
SEED_MAX = 2**32 - 1  # numpy's seeds; the epoch's seed is seed * 1_000_003 + epoch in int64


def check_count(name: str, value, *, low: int, high: int, example: int, what: str,
                too_large: str = "") -> int:
    """`value` as an int when it is one (not a bool) from `low` to `high`; else ValueError
    saying it must be `what` (and, for an int above `high`, `too_large`).

    Example:
        >>> check_count("seed", np.int64(3), low=0, high=SEED_MAX, example=42, what="an int")
        3
    """
    if (isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer))
            or not low <= value <= high):
        note = too_large if isinstance(value, (int, np.integer)) and value > high else ""
        raise ValueError(f"{name} must be {what}. Received: {name}={value!r}{note}. Use e.g. "
                         f"{name}={example}.")
    return int(value)


def check_seed(seed) -> None:
    """Raises ValueError unless `seed` is None or an int from 0 to 2**32 - 1."""
    if seed is not None:
        check_count("seed", seed, low=0, high=SEED_MAX, example=42,
                    what="None or an integer from 0 to 2**32 - 1")


def check_shuffle_buffer(shuffle_buffer) -> None:
    """Raises ValueError unless `shuffle_buffer` is None or a positive int (0 would read
    as "unset", -1 fails in tf.data)."""
    if shuffle_buffer is not None:
        check_count("shuffle_buffer", shuffle_buffer, low=1, high=2**63 - 1, example=10_000,
                    what="None (all the data) or a positive number of examples")


def check_size(size: int, global_batch_size: int, remainder: str, replicas: int) -> None:
    """Raises ValueError for data of no batch; warns of a global batch far above it.

    A global batch larger than the data is legitimate (Keras takes one on one device: a
    validation set smaller than the training batch, a tiny data set), and makes the same
    one step of every example as the data's size rounded up to a multiple of the
    replicas: padded copies weigh nothing, the real examples `global_batch_size / size`.
    Its further slots are copies, millions for a huge batch, so more than twice that
    size is warned of, naming the size that holds it all; it is not refused.
    """
    if size == 0 or (remainder == "drop" and size < global_batch_size):
        raise ValueError(
            f"The data holds {size} examples: no batch to make. Received: {size} examples, "
            f"global_batch_size={global_batch_size}, drop_remainder="
            f"{remainder == 'drop'}. Pass more data or a smaller global_batch_size."
        )
    whole = -(-size // replicas) * replicas  # every example in one step
    if remainder == "pad" and replicas > 1 and global_batch_size > 2 * whole:
        warnings.warn(
            f"global_batch_size={global_batch_size} is more than twice the data: the one "
            f"step of all {size} examples is padded with {global_batch_size - size} copies "
            f"(of weight -0.0: the loss and metrics are those of "
            f"global_batch_size={whole}). Pass global_batch_size={whole} to skip them.",
            UserWarning, stacklevel=3)
