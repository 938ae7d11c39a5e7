"""Where training is in its data: the epoch that keys each shuffle, the steps to skip.

Every pass over an `sk.shard` dataset reads the training position when it starts:

* **the epoch** keys its shuffle order and its augmentation seeds, so epoch `e` with
  `sk.shard(..., shuffle=True, seed=s)` is always ordered the same way, whether the run
  was interrupted or not. `EpochTracker`, a callback every `fit()` gets, sets it when an
  epoch begins (Keras makes an epoch's iterator after `on_epoch_begin`).
* **the steps to skip**, set by `sk.callbacks.BackupAndRestore` when it resumes from a
  backup written in the middle of an epoch: the next pass starts at the following step.
  The first pass to start takes them; later passes start at step 0.

The position lives in two `tf.Variable`s on the host, read inside the input pipeline
when each pass starts; they are made when `sk.shard` first needs them.

A *continuous* dataset (`positioned(..., continuous=True)`) is every epoch's pass one
after the other, from the epoch set when its iterator starts: pass `k` is epoch
`first + k`, whenever tf.data prefetches it. `strategykit.data.stream` keeps one iterator
of it for many epochs.
"""

from __future__ import annotations

import threading

import keras
import tensorflow as tf

from strategykit.data.own_functions import traced_as_written
from strategykit.upstream.every_fit import add_to_every_fit

_VARIABLES: dict = {}


def _variables() -> dict:
    """The position variables `{"epoch", "skip"}` of this host, made once.

    They are made in a thread of their own: a strategy's scope holds for the thread that
    entered it, and a variable made inside one would be mirrored over its devices.
    """
    if not _VARIABLES:

        def make():
            with tf.device("/cpu:0"):
                for name in ("epoch", "skip"):
                    _VARIABLES[name] = tf.Variable(0, dtype=tf.int64, trainable=False)

        maker = threading.Thread(target=make, name="strategykit-position")
        maker.start()
        maker.join()
        add_to_every_fit(EpochTracker)
    return _VARIABLES



def set_epoch(epoch: int) -> None:
    """Passes over `sk.shard` data that start from now on are epoch `epoch`'s."""
    _variables()["epoch"].assign(int(epoch))


def skip_steps(steps: int) -> None:
    """The next pass over `sk.shard` data to start leaves out its first `steps` steps."""
    _variables()["skip"].assign(int(steps))


def current_epoch() -> int:
    """The epoch passes that start now are keyed by (0 before any `fit()`)."""
    return int(_variables()["epoch"].numpy())


def pending_skip() -> int:
    """The steps the next pass to start leaves out (0 unless a run was resumed)."""
    return int(_variables()["skip"].numpy())


def positioned(make_pass, *, continuous: bool = False, resumes: bool = True,
               autograph: bool = True) -> tf.data.Dataset:
    """A dataset whose every pass is `make_pass(epoch)`, started at the training position.

    Args:
        make_pass: a function of the epoch (an int64 tensor) returning that epoch's pass,
            one element (a step's batch) per training step: a skip leaves out elements.
        continuous: every pass of the dataset is one epoch's pass (the current one)
            when False (default); when True, one pass holds every epoch's pass from the
            current one on, endlessly, the first starting at the pending skip.
        resumes: the first pass takes the pending skip (default); False: every pass
            starts at its first step and leaves the skip to a dataset that resumes
            (`predict()` between a resume and the `fit()` it resumes).
        autograph: AutoGraph converts `make_pass` and the functions its pass maps, as
            tf.data converts a user's (default, for passes that run a user's function);
            False: they are traced as written (`strategykit.data.own_functions`).

    Returns:
        The dataset; its cardinality is unknown to tf.data (a pass may be shorter), so
        state the steps to Keras separately.

    Example:
        >>> import tensorflow as tf
        >>> ds = positioned(lambda epoch: tf.data.Dataset.from_tensors(epoch),
        ...                 continuous=True)
        >>> [int(e) for e in ds.take(3)]  # epochs 0, 1, 2 after one another
        [0, 1, 2]
    """
    variables = _variables()

    def epochs(_):
        first = variables["epoch"].read_value()
        if resumes:
            skip = variables["skip"].read_value()
            with tf.control_dependencies([first, skip]):
                cleared = variables["skip"].assign(0)
            with tf.control_dependencies([cleared]):
                first = tf.identity(first)
        else:
            skip = tf.constant(0, tf.int64)
        if not continuous:  # one pass: no dataset of epochs to trace the pass inside
            return make_pass(first).skip(skip)
        epoch = tf.data.Dataset.range(first, tf.constant(tf.int64.max, tf.int64))
        skips = tf.data.Dataset.from_tensors(skip).concatenate(
            tf.data.Dataset.from_tensors(tf.constant(0, tf.int64)).repeat())
        return tf.data.Dataset.zip((epoch, skips)).flat_map(
            lambda epoch, skip: make_pass(epoch).skip(skip))

    return tf.data.Dataset.from_tensors(0).flat_map(
        epochs if autograph else traced_as_written(epochs))


class EpochTracker(keras.callbacks.Callback):
    """Sets the epoch of the training position when an epoch begins (every `fit()`)."""

    async_safe = True

    def on_epoch_begin(self, epoch, logs=None):
        set_epoch(epoch)
