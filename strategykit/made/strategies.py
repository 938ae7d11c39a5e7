"""The strategies strategykit made or sharded data for: the only ones its fixes touch.

`sk.mirrored()` and `sk.from_env()` register each strategy they build, and `sk.shard()`
the strategy it shards for (a user's own `tf.distribute.MirroredStrategy` too, as its
data carries strategykit's padding marks). Every fix in `strategykit/upstream/` asks
`is_ours` (or `in_ours`, for the strategy in play) before it changes anything, and
otherwise hands over to upstream's own code: a model of any other strategy, and every
one-device model, runs as if strategykit were not imported.
"""

from __future__ import annotations

import weakref

import tensorflow as tf

_OURS: weakref.WeakSet = weakref.WeakSet()
_DEFAULT_SHARDED_FOR: list = []  # the default strategy, once sk.shard sharded for it


def register(strategy: tf.distribute.Strategy) -> tf.distribute.Strategy:
    """Records `strategy` as one strategykit made (or shards for); returns it.

    The default strategy (`tf.distribute.get_strategy()` outside any scope: one device)
    is never one of ours, as every one-device model runs on it; `sk.shard` for it is
    recorded apart (`sharded_for`), for the training position of its data.

    Example:
        >>> import tensorflow as tf
        >>> strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
        >>> is_ours(strategy), is_ours(register(strategy))
        (False, True)
    """
    if not tf.distribute.has_strategy() and strategy is tf.distribute.get_strategy():
        _DEFAULT_SHARDED_FOR[:] = [strategy]
    else:
        _OURS.add(strategy)
    return strategy


def is_ours(strategy) -> bool:
    """Whether `strategy` is one strategykit made or sharded data for (False for None,
    for the default strategy outside any scope and for any other object)."""
    try:
        return strategy in _OURS
    except TypeError:  # not weakly referable: not a strategy of ours
        return False


def sharded_for(strategy) -> bool:
    """Whether `strategy` is one of ours, or the default strategy once `sk.shard` sharded
    data for it: where strategykit's callbacks join every `fit()` (the training position
    of its data, `strategykit.data.position`), though no fix changes the training."""
    return is_ours(strategy) or any(strategy is default for default in _DEFAULT_SHARDED_FOR)


def in_ours() -> bool:
    """Whether the strategy in play (`tf.distribute.get_strategy()`, in a scope, a
    replica step or a cross-replica call) is one of ours.

    Example:
        >>> import tensorflow as tf
        >>> with register(tf.distribute.OneDeviceStrategy("/cpu:0")).scope():
        ...     in_ours()
        True
        >>> in_ours()
        False
    """
    return is_ours(tf.distribute.get_strategy())
