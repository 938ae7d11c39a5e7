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
"""

from __future__ import annotations

import threading

import keras
import tensorflow as tf

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


def epoch() -> tf.Tensor:
    """The epoch, inside a pass's function (read when the pass starts)."""
    return _variables()["epoch"].read_value()


def positioned(make_pass, elements_per_step: int) -> tf.data.Dataset:
    """A dataset whose every pass is `make_pass()`, started at the training position.

    Args:
        make_pass: a function of no arguments returning one pass's dataset; it may read
            `epoch()`.
        elements_per_step: elements of that dataset per training step.

    Returns:
        The dataset; its cardinality is unknown to tf.data (a pass may be shorter), so
        state the steps to Keras separately.
    """
    variables = _variables()

    def one_pass(_):
        skip = variables["skip"].read_value()
        with tf.control_dependencies([skip]):
            cleared = variables["skip"].assign(0)
        with tf.control_dependencies([cleared]):
            return make_pass().skip(skip * elements_per_step)

    return tf.data.Dataset.from_tensors(0).flat_map(one_pass)


class EpochTracker(keras.callbacks.Callback):
    """Sets the epoch of the training position when an epoch begins (every `fit()`)."""

    async_safe = True

    def on_epoch_begin(self, epoch, logs=None):
        set_epoch(epoch)
