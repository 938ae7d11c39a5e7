"""A model and `sk.shard` data of different strategies: one clear error before any step.

A model built outside `strategy.scope()` (or in another strategy's scope) and fed the
data `sk.shard(..., strategy)` made fails inside Keras's first step with `ValueError:
Only input tensors may be passed as positional arguments ... PerReplica:{...}`, which
says nothing of scopes. `sk.shard` registers the strategy of every dataset it makes
(`register`); `fit()`, `evaluate()` and `predict()` of such a dataset call `check`
first (from the fixes `strategykit.upstream.multi_worker` and `exact_predictions`, which
replace the methods Keras starts them with), which compares the model's variables with the
strategy by public API (`StrategyExtended.variable_created_in_scope`).
"""

from __future__ import annotations

import weakref

import tensorflow as tf

_STRATEGIES = weakref.WeakKeyDictionary()  # distributed dataset -> its strategy


def register(distributed, strategy: tf.distribute.Strategy) -> None:
    """Records that `sk.shard` made `distributed` for `strategy`."""
    _STRATEGIES[distributed] = strategy


def strategy_of(distributed) -> tf.distribute.Strategy | None:
    """The strategy `distributed` was made for by `sk.shard`, or None."""
    try:
        return _STRATEGIES.get(distributed)
    except TypeError:  # not weakly referable: not sk.shard's
        return None


def check(model, distributed, call: str) -> None:
    """Raises where `model` was not built in the scope of the strategy of `distributed`.

    Args:
        model: the Keras model `call` was called on.
        distributed: what `call` was given as `x` (anything; only `sk.shard`'s data is
            checked).
        call: what was called, for the message, e.g. `"predict()"`.

    Raises:
        ValueError: the model's variables were created outside the scope of the data's
            strategy.

    Example:
        >>> import keras
        >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        >>> check(model, [1, 2, 3], "fit()")  # not sk.shard data: nothing to check
    """
    strategy = strategy_of(distributed)
    variables = [getattr(v, "value", v) for v in getattr(model, "weights", [])[:1]]
    if strategy is None or not variables:  # unbuilt: Keras builds it in the scope
        return
    if strategy.extended.variable_created_in_scope(variables[0]):
        return
    where = ("in the scope of another strategy"
             if isinstance(variables[0], tf.distribute.DistributedValues)
             else "outside any strategy's scope")
    raise ValueError(
        f"model.{call} was given data that sk.shard made for a "
        f"{type(strategy).__name__} of {strategy.num_replicas_in_sync} replicas, but the "
        f"model {model.name!r} was built {where}. Received: a model whose variables, "
        f"e.g. {variables[0].name!r}, were not created in that strategy's scope. Build "
        "and compile the model inside `with strategy.scope():` of the strategy you pass "
        "to sk.shard (or shard the data with the strategy the model was built in)."
    )
