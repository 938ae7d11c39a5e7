"""Keras 2 refused clearly: its objects where strategykit takes Keras 3's, and the variable.

strategykit works with Keras 3 (`import keras`) only: its fixes, synchronized batch norm
and exact metrics are Keras 3 code. Keras 2 comes from the `tf_keras` package, and
TensorFlow routes `tf.keras` to it when `TF_USE_LEGACY_KERAS` is `1`, `true` or `True`
(many older programs set it). A Keras 2 object passed in is recognised by the modules of
its classes (`tf_keras.`, or TensorFlow's own old copy), without importing `tf_keras`,
and refused naming the variable and the fix. The variable alone is no error: Ray 2.57 and
later set it in every worker, where `import keras` models work as anywhere; so it gets
one warning, at the first strategy built, when `tf_keras` is installed (`tf.keras` is then
Keras 2). Standard library only.
"""

from __future__ import annotations

import importlib.util
import os
import warnings

VARIABLE = "TF_USE_LEGACY_KERAS"
"""The environment variable that makes `tf.keras` Keras 2 (TensorFlow 2.16 and later)."""

_TRUE = ("1", "true", "True")  # the values TensorFlow's `tf.keras` loader acts on
_KERAS_2_MODULES = ("tf_keras.", "tensorflow.python.keras.")
_warned = False


def is_keras_2(value) -> bool:
    """Whether `value` (an object or a class) is Keras 2's, or a subclass of one of its
    classes, judged by the modules its classes are defined in.

    Example:
        >>> import keras
        >>> is_keras_2(keras.Sequential()), is_keras_2(3)
        (False, False)
    """
    cls = value if isinstance(value, type) else type(value)
    return any(f"{klass.__module__}.".startswith(_KERAS_2_MODULES) for klass in cls.__mro__)


def legacy_keras_requested() -> bool:
    """Whether `TF_USE_LEGACY_KERAS` asks TensorFlow for Keras 2 as `tf.keras`."""
    return os.environ.get(VARIABLE) in _TRUE


def check_not_keras_2(value, argument: str) -> None:
    """Raises ValueError when `value`, passed as `argument`, is a Keras 2 object.

    Example:
        >>> import keras
        >>> check_not_keras_2(keras.Sequential(), "model")  # a Keras 3 model: no error
    """
    if not is_keras_2(value):
        return
    cls = value if isinstance(value, type) else type(value)
    raise ValueError(
        f"{argument} is a Keras 2 object ({cls.__module__}.{cls.__qualname__}, from the "
        f"tf_keras package), and strategykit works with Keras 3 only. Received: {argument}="
        f"{cls.__name__} (Keras 2). {_fix()}"
    )


def warn_if_legacy_keras() -> None:
    """Warns once per process when `tf.keras` is Keras 2: `TF_USE_LEGACY_KERAS` set and
    `tf_keras` installed (looked up, not imported)."""
    global _warned
    if _warned or not legacy_keras_requested() or importlib.util.find_spec("tf_keras") is None:
        return
    _warned = True
    warnings.warn(
        "strategykit works with Keras 3 only, and it refuses tf.keras models and metrics "
        f"here: {_fix()}", UserWarning, stacklevel=3)


def _fix() -> str:
    keras_3 = ("with Keras 3: `import keras` and keras.Sequential(...), keras.Model(...), "
               "keras.layers.*, instead of tf.keras or tf_keras.")
    if legacy_keras_requested():
        return (f"{VARIABLE}={os.environ[VARIABLE]} is set, so tf.keras is Keras 2. Unset "
                f"it (or set {VARIABLE}=0), and build the model {keras_3}")
    return f"Build the model {keras_3}"
