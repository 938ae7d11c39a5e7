"""How a metric's state combines across replicas: `sk.combine_across_replicas`.

Under a strategy each replica updates its own copy of a metric's variables with its own
examples, and Keras reads the metric by adding the copies up (`aggregation="sum"`, the
default of `Metric.add_variable`; `"mean"` and `"only_first_replica"` average them or
take the first). That is exact for a sum over examples (a total, a count, a confusion
matrix: every Keras built-in metric) and wrong for anything else: the replicas' running
maxima added up are not the maximum. Keras has no way to say "combine by maximum".

`combine_across_replicas(metric, variable="max")` says it, for one metric or for every
metric of a class. In each of Keras's steps (`strategykit.upstream.exact_metrics`) each
replica then updates the variable from the combined value, and the replicas' updated
values are combined again (one all-gather of the variable) and stored back, each copy
holding `1 / replicas` of it so that Keras's sum reads the combined value. A metric of
your own (not from Keras) that is not declared gets a warning at its first use under
more than one replica, naming it, its variables and this function.
"""

from __future__ import annotations

import warnings
import weakref

import keras
import tensorflow as tf

from strategykit.pinning.legacy_keras import check_not_keras_2

_COMBINES = {
    "sum": None,  # Keras's own: each copy a part of the sum
    "max": lambda values: tf.reduce_max(values, axis=0),
    "min": lambda values: tf.reduce_min(values, axis=0),
}
_DECLARED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # metric or class -> {}
_WARNED: weakref.WeakSet = weakref.WeakSet()


def combine_across_replicas(metric, **combine):
    """Says how each state variable of a metric combines across replicas.

    Keras adds up the replicas' copies of a metric's variables: right for sums over
    examples (totals, counts), wrong for a running maximum or minimum. Declare those,
    and strategykit keeps them exact in `fit()` and `evaluate()` under any strategy
    (one all-gather of each such variable per step). Declaring `"sum"` says that
    Keras's own way is right, which silences the warning a metric of your own gets.

    Args:
        metric: a `keras.metrics.Metric`, or a subclass (for all its instances).
        **combine: `variable_name="sum" | "max" | "min"`, or a function of the
            replicas' values stacked on a new first axis returning the combined value
            (e.g. `lambda values: tf.reduce_max(values, axis=0)`).

    Returns:
        `metric`, so that it can wrap a class definition or an instance in `compile()`.

    Raises:
        ValueError: `metric` is not a Keras 3 metric (a Keras 2 one from tf_keras is
            refused), no variable is named, a combine is
            unknown, or an instance has no variable of a given name.

    Example:
        >>> import keras, strategykit as sk
        >>> class RunningMax(keras.metrics.Metric):
        ...     def __init__(self, name="running_max"):
        ...         super().__init__(name=name)
        ...         self.maximum = self.add_variable((), "zeros", name="maximum")
        ...     def update_state(self, y_true, y_pred, sample_weight=None):
        ...         self.maximum.assign(keras.ops.maximum(self.maximum, keras.ops.max(y_pred)))
        ...     def result(self):
        ...         return self.maximum
        >>> _ = sk.combine_across_replicas(RunningMax, maximum="max")
    """
    check_not_keras_2(metric, "metric")
    is_class = isinstance(metric, type)
    if not (issubclass(metric, keras.metrics.Metric) if is_class
            else isinstance(metric, keras.metrics.Metric)):
        raise ValueError(
            "combine_across_replicas needs a keras.metrics.Metric or a subclass of it. "
            f"Received: metric={metric!r}. Pass the metric you give compile(), or its class."
        )
    if not combine:
        raise ValueError(
            "combine_across_replicas needs at least one variable. Received: no keyword "
            "arguments. Name each variable and how it combines, e.g. maximum=\"max\"."
        )
    for name, how in combine.items():
        if not callable(how) and how not in _COMBINES:
            raise ValueError(
                f"Unknown combine for variable {name!r}. Received: {name}={how!r}. Use "
                "\"sum\", \"max\", \"min\" or a function of the stacked replicas' values."
            )
    if not is_class:
        names = [variable.name for variable in metric.variables]
        missing = sorted(set(combine) - set(names))
        if missing:
            raise ValueError(
                f"Metric {metric.name!r} has no variable {', '.join(map(repr, missing))}. "
                f"Received: {', '.join(f'{n}=...' for n in missing)}. Its variables: "
                f"{', '.join(map(repr, names)) or 'none'}."
            )
    _DECLARED[metric] = {**_DECLARED.get(metric, {}), **combine}
    return metric


def declared(metric) -> dict | None:
    """`{variable name: combine}` declared for `metric` or its classes; None if none."""
    found = None
    for owner in (*reversed(type(metric).__mro__), metric):
        try:
            entry = _DECLARED.get(owner)
        except TypeError:  # not weak-referenceable
            entry = None
        if entry is not None:
            found = {**(found or {}), **entry}
    return found


def _combined_variables(metrics):
    """`(variable, combine function)` of every declared variable not combined by sum."""
    pairs = []
    for metric in metrics:
        combine = declared(metric) or {}
        for variable in metric.variables:
            how = combine.get(variable.name, "sum")
            function = _COMBINES.get(how) if isinstance(how, str) else how
            if function is not None:
                pairs.append((variable, function))
    return pairs


def _copies(variable, replicas: int) -> int:
    """How many copies Keras's read adds up: all for `"sum"`, else one value."""
    return replicas if variable.aggregation == "sum" else 1


def before_update(metrics, replicas: int) -> None:
    """In replica context: each declared variable back from its share to the whole."""
    for variable, _ in _combined_variables(metrics):
        variable.assign(tf.convert_to_tensor(variable) * _copies(variable, replicas))


def after_update(metrics, replicas: int) -> None:
    """In replica context: combine the replicas' values, each copy keeping its share."""
    context = tf.distribute.get_replica_context()
    for variable, function in _combined_variables(metrics):
        value = tf.convert_to_tensor(variable)
        values = context.all_gather(tf.expand_dims(value, 0), axis=0)
        combined = tf.cast(function(values), value.dtype)
        variable.assign(combined / tf.cast(_copies(variable, replicas), value.dtype))


def warn_of_undeclared(metrics, replicas: int) -> None:
    """Warns once per metric of a class not from Keras whose combining is not declared."""
    for metric in metrics:
        if (metric in _WARNED or declared(metric) is not None or not metric.variables
                or type(metric).__module__.split(".")[0] == "keras"):
            continue
        _WARNED.add(metric)
        variables = ", ".join(f"{v.name!r} (aggregation {v.aggregation!r})"
                              for v in metric.variables)
        first = metric.variables[0].name
        warnings.warn(
            f"strategykit: metric {metric.name!r} ({type(metric).__name__}) keeps its "
            f"state in {variables}. Under {replicas} replicas each replica updates its own "
            "copy with its own examples and Keras adds the copies up when it reads the "
            "metric: right for a sum over examples (a total, a count), wrong for a "
            "maximum, a minimum or a last value. Say how each variable combines, e.g. "
            f"sk.combine_across_replicas({type(metric).__name__}, {first}=\"max\") "
            f"(or {first}=\"sum\" if it is a sum), before fit() or evaluate().",
            stacklevel=2,
        )
