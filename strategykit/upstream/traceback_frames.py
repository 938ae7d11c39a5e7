"""Keras hides strategykit's frames from the user's tracebacks, as it hides its own.

Keras filters the tracebacks of errors raised through `fit()`, `evaluate()`, a layer's
`__call__` and the rest of its API (`keras.config.disable_traceback_filtering()` turns
it off): `traceback_utils._process_traceback_frames` keeps the frames for which
`include_frame(filename)` is True, False for Keras's own source directory and for
`tensorflow/python`. strategykit's fixes run inside Keras's internals (the step
function of `steps_per_execution`, the metrics of `exact_metrics`, ...), so without
this an error of the user's `train_step` shows strategykit frames among the user's,
and a Keras or TensorFlow error shows one of ours innermost, pointing the user at the
wrong code. The fix replaces `include_frame` (looked up by `_process_traceback_frames`
at each call) with one that also hides the strategykit package; the same on Keras
3.8.0 to 3.15.1. Where the code is unknown Keras's own filter runs: our frames show,
nothing else changes (no refusal). No upstream issue asks for it and Keras has no way
to register other paths (JAX has one, jax-ml/jax#4707): its `issue` says
"unreported".
"""

from __future__ import annotations

import os

from strategykit.pinning.fix import Fix, original, resolve

_TRACEBACK_UTILS = "keras.src.utils.traceback_utils"
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _include_frame(filename: str) -> bool:
    """Keras's `include_frame`, and False for strategykit's own source files."""
    return (not os.path.abspath(filename).startswith(_PACKAGE)
            and original(resolve(_TRACEBACK_UTILS), "include_frame")(filename))


FIXES = (
    Fix(
        issue="keras-team/keras (unreported)",
        affects="tracebacks without strategykit's frames",
        owner=_TRACEBACK_UTILS,
        attribute="include_frame",
        replacement=_include_frame,
        relies_on={
            f"{_TRACEBACK_UTILS}:include_frame": "dc881bdbf52a7804",  # replaced
            # looks include_frame up at each call, keeps the frames it includes
            f"{_TRACEBACK_UTILS}:_process_traceback_frames": "5a851c45a0e569b1",
        },
        refuses_when=None,  # unknown code: Keras's own filter, our frames shown
    ),
)
