"""What strategykit sets and reads inside TensorFlow's strategies: collective keys and
the all-reduce in use.

* **Collective keys.** TensorFlow starts the collective group keys of every
  `MirroredStrategy` at 1. Two strategies over different device sets in one process (a
  notebook cell re-run with another replica count, a test suite) then join the same
  group with different sizes and fail with "Device CPU:0 is joining a group with size
  4, but that group has size 2". `MirroredExtended.__init__` reads its key base from the
  private class attribute `_collective_key_base` of the strategy object;
  `mirrored_strategy(...)` gives each strategy its own range of keys. On unknown code it
  builds the strategy as TensorFlow does (two sizes in one process then fail as above).
* **The all-reduce in use.** TensorFlow has no public accessor for it:
  `all_reduce_in_use(strategy)` reads the private `_cross_device_ops` and
  `_communication_options` of the strategy's `extended` (`sk.describe`'s
  `all_reduce`); on unknown code it says nothing (`sk.describe` says "unknown").

Both are `PinnedAccess`es, pinned on TensorFlow 2.18.1, 2.20.0 and 2.21.0 (the same
code on each).
"""

from __future__ import annotations

import itertools

import tensorflow as tf

from strategykit.pinning.pinned_access import PinnedAccess

_MIRRORED = "tensorflow.python.distribute.mirrored_strategy"
_COLLECTIVE = "tensorflow.python.distribute.collective_all_reduce_strategy"

COLLECTIVE_KEYS = PinnedAccess(
    issue="tensorflow/tensorflow (unreported)",
    affects="several MirroredStrategy sizes in one process",
    relies_on={f"{_MIRRORED}:MirroredStrategy.__init__": "4f25a1d7ef133ca0",
               f"{_MIRRORED}:MirroredExtended.__init__": "d4cd84cc71cdbd97"},
    refuses=False)

ALL_REDUCE = PinnedAccess(
    issue="tensorflow/tensorflow (unreported)",
    affects="the all-reduce sk.describe names",
    relies_on={f"{_MIRRORED}:MirroredExtended.__init__": "d4cd84cc71cdbd97",
               f"{_MIRRORED}:MirroredExtended._initialize_strategy": "3d9dad14ef4cc6d8",
               f"{_MIRRORED}:MirroredExtended._initialize_multi_worker": "8f6d688b1f1a535b",
               f"{_COLLECTIVE}:CollectiveAllReduceExtended.__init__": "b6318b216be44815",
               f"{_COLLECTIVE}:CollectiveAllReduceExtended._initialize_local":
                   "329bb841a40beb30",
               f"{_COLLECTIVE}:CollectiveAllReduceExtended._initialize_multi_worker":
                   "cbbc45b106e7c03c"},
    refuses=False)

PINNED = (COLLECTIVE_KEYS, ALL_REDUCE)

KEYS_PER_STRATEGY = 100_000
"""The collective group keys each strategy `mirrored_strategy` builds has to itself."""
_strategies_built = itertools.count(1)


def mirrored_strategy(devices, cross_device_ops) -> tf.distribute.MirroredStrategy:
    """`tf.distribute.MirroredStrategy(devices, cross_device_ops)` with collective group
    keys of its own, so that strategies of different sizes live in one process.

    Example:
        >>> first = mirrored_strategy(["/cpu:0"], None)
        >>> second = mirrored_strategy(["/cpu:0"], None)
        >>> second.extended._collective_key_base - first.extended._collective_key_base
        100000
    """
    strategy = tf.distribute.MirroredStrategy.__new__(tf.distribute.MirroredStrategy)
    if COLLECTIVE_KEYS.known():
        strategy._collective_key_base = next(_strategies_built) * KEYS_PER_STRATEGY
    strategy.__init__(devices=devices, cross_device_ops=cross_device_ops)
    return strategy


def all_reduce_in_use(strategy) -> tuple:
    """`(cross_device_ops, communication_options)` of `strategy`, each None where the
    strategy has none or TensorFlow's code is unknown.

    Example:
        >>> ops, options = all_reduce_in_use(tf.distribute.MirroredStrategy(["/cpu:0"]))
        >>> isinstance(ops, tf.distribute.CrossDeviceOps)
        True
    """
    if not ALL_REDUCE.known():
        return None, None
    extended = strategy.extended
    return (getattr(extended, "_cross_device_ops", None),
            getattr(extended, "_communication_options", None))
