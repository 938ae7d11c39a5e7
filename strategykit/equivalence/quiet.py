"""`sk.check` in float64 without TensorFlow's `Not handling type DT_DOUBLE` lines.

TensorFlow's grappler *remapper* pass, which fuses ops into oneDNN kernels on CPUs, asks
of every op it could fuse whether oneDNN takes its dtype, and logs a warning for each
float64 one (`util.cc:163] Not handling type DT_DOUBLE`): about 60 lines for the check
of a two-layer Dense model, on TensorFlow 2.18 to 2.21 built with oneDNN (the default on
x86 Linux). The pass has nothing to fuse in float64, so inside a float64 check it is
switched off with TensorFlow's public `tf.config.optimizer.set_experimental_options`,
for the functions the check runs, and switched back on afterwards; the user's logging
settings (`TF_CPP_MIN_LOG_LEVEL`, absl, Python logging) are never touched. Measured with
`TF_CPP_MIN_LOG_LEVEL=0` on TensorFlow 2.21: 60 lines before, 0 after; turning off the
layout optimizer instead leaves all 60.
"""

from __future__ import annotations

import contextlib

import tensorflow as tf

_REMAPPING = "remapping"


@contextlib.contextmanager
def float64_quieted(dtype: str | None):
    """Inside, when `dtype` is `"float64"`, the remapper pass is off; on afterwards.

    Afterwards the option is as before when the user had set it, else explicitly on
    (`{"remapping": True}` in `tf.config.optimizer.get_experimental_options()`), which
    is what TensorFlow's default does: TensorFlow has no public way to unset it.

    Example:
        >>> import tensorflow as tf
        >>> with float64_quieted("float64"):
        ...     tf.config.optimizer.get_experimental_options()["remapping"]
        False
        >>> tf.config.optimizer.get_experimental_options().get("remapping", True)
        True
    """
    if dtype != "float64":
        yield
        return
    previous = tf.config.optimizer.get_experimental_options().get(_REMAPPING, True)
    tf.config.optimizer.set_experimental_options({_REMAPPING: False})
    try:
        yield
    finally:
        tf.config.optimizer.set_experimental_options({_REMAPPING: previous})
