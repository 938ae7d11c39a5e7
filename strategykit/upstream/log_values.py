"""Keras before 3.12: a metric whose `result()` returns its variable, reported as a number.

Keras turns every value it reports (`History`, `evaluate()`, the callbacks' logs) into a
float with `python_utils.pythonify_logs`, which tries `float(value)` and keeps the value
as it is where that fails. A metric of the user's own may return its state variable
itself from `result()` (a running maximum, a last value); under a strategy that variable
is TensorFlow's `SyncOnReadVariable`, which `float()` refuses, so before Keras 3.12
`evaluate()` and `History` hand the user the variable (and `float()` of it fails in
their code). Keras 3.12 converts tensors with `convert_to_numpy` first; no upstream issue
was found. This fix reads such a variable (in the cross-replica context: the value
combined over the replicas) before Keras's own conversion, on the versions without it.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from strategykit.made import strategies
from strategykit.pinning.fix import Fix, original, resolve

_PYTHON_UTILS = "keras.src.utils.python_utils"


def _pythonify_logs(logs):
    """Keras's `pythonify_logs`, with TensorFlow variables read to their values first."""
    return original(resolve(_PYTHON_UTILS), "pythonify_logs")(_read_variables(logs))


def _read_variables(logs):
    if not isinstance(logs, dict):
        return logs
    return {key: _read_variables(value) if isinstance(value, dict) else _read(value)
            for key, value in logs.items()}


def _read(value):
    """The value of a variable of a strategy of strategykit's (a Keras variable's too) as
    a tensor; anything else as it is, as Keras hands it over."""
    variable = value.value if isinstance(value, keras.Variable) else value
    if isinstance(variable, tf.distribute.DistributedValues) and strategies.is_ours(
            getattr(variable, "distribute_strategy", None)):
        return tf.convert_to_tensor(variable)
    return value


FIXES = (
    Fix(
        issue="keras-team/keras@3.12.0",
        affects="metrics whose result() returns a variable, under a strategy",
        owner=_PYTHON_UTILS,
        attribute="pythonify_logs",
        replacement=_pythonify_logs,
        # Keras 3.8.0 to 3.11.3: float(value), or the value as it is
        relies_on={f"{_PYTHON_UTILS}:pythonify_logs": "e604d7807d5593e7"},
        # None: where the fix cannot install, Keras hands back the variable, which the
        # user sees (and float() of it fails): not silent.
        refuses_when=None,
        # Keras 3.12.0 to 3.15.1: tensors through convert_to_numpy first
        fixed_upstream={f"{_PYTHON_UTILS}:pythonify_logs": "ecbf66de4514267d"},
    ),
)
