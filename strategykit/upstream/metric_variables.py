"""keras-team/keras#21061: metric variables synchronized on read, as Keras 3.10 makes them.

Keras 3.8 and 3.9 make a metric's variables (`Metric.add_variable`) ordinary TensorFlow
variables, which a `MirroredStrategy` mirrors and keeps equal on every replica: each
replica's `assign_add` in Keras's step then goes through TensorFlow's cross-replica
update of a mirrored variable, and the metrics Keras reports under several replicas are
not one device's (seen: the mean of labels whose mean is 0.25 reported as 0.53, and so
the loss). Keras fixed it upstream (keras-team/keras#21072, from Keras 3.10) by making
them `synchronization="on_read"`: each replica keeps its own copy, added up when read.
These fixes do the same on the versions without it (Keras 3.8 and 3.9):

* `Metric.add_variable` creates its variable with a mark (a flag of this thread while
  the variable is made, and an attribute on it for one whose creation is deferred).
* The TensorFlow backend's `Variable._initialize` creates a marked variable's
  `tf.Variable` with `synchronization=ON_READ`, as Keras 3.10 does, and every other
  variable as Keras does.

On a Keras that passes `synchronization="on_read"` itself (`fixed_upstream`) neither is
installed.
"""

from __future__ import annotations

import threading

import tensorflow as tf

from strategykit.made import strategies
from strategykit.pinning.fix import Fix, original, resolve

ISSUE = "keras-team/keras#21061"
_METRIC = "keras.src.metrics.metric:Metric"
_TF_VARIABLE = "keras.src.backend.tensorflow.core:Variable"
_creating = threading.local()


def _add_variable_read_synchronized(self, *args, **kwargs):
    """Keras's `Metric.add_variable`, its variable marked to be synchronized on read in
    the scope of a strategy of strategykit's (Keras's own everywhere else)."""
    if not strategies.in_ours():
        return original(resolve(_METRIC), "add_variable")(self, *args, **kwargs)
    _creating.metric = True
    try:
        variable = original(resolve(_METRIC), "add_variable")(self, *args, **kwargs)
    finally:
        _creating.metric = False
    variable._strategykit_on_read = True  # for a deferred creation
    return variable


def _initialize(self, value):
    """Keras 3.8's `Variable._initialize`, with `ON_READ` for a metric's variable."""
    if not (getattr(_creating, "metric", False)
            or getattr(self, "_strategykit_on_read", False)):
        return original(resolve(_TF_VARIABLE), "_initialize")(self, value)
    self._value = tf.Variable(
        value,
        dtype=self._dtype,
        trainable=self.trainable,
        name=self.name,
        aggregation=self._map_aggregation(self.aggregation),
        synchronization=tf.VariableSynchronization.ON_READ,
    )


def _under_several_replicas(*args, **kwargs) -> bool:
    """Where mirrored metric variables report other numbers: a strategy of strategykit's
    of several replicas."""
    return (strategies.in_ours()
            and tf.distribute.get_strategy().num_replicas_in_sync > 1)


_AFFECTS = "the metrics and loss Keras reports under several replicas"
# Keras 3.10.0 to 3.15.1: add_variable passes synchronization="on_read" itself.
_FIXED_UPSTREAM = {f"{_METRIC}.add_variable": "3bc628b9d872ff3f"}
_RELIES_ON = {  # Keras 3.8.0 to 3.9.2
    f"{_METRIC}.add_variable": "7dc1b2191bf46f5a",  # wrapped: makes one backend Variable
    f"{_TF_VARIABLE}._initialize": "c8c1d01d1f935c69",  # replaced for metric variables
    # calls _initialize at once, or from _deferred_initialize later
    "keras.src.backend.common.variables:Variable.__init__": "32a7c851c7f617c0",
    "keras.src.backend.common.variables:Variable._deferred_initialize": "437c15620e8091ad",
}

FIXES = (
    Fix(issue=ISSUE, affects=_AFFECTS, owner=_METRIC, attribute="add_variable",
        replacement=_add_variable_read_synchronized, relies_on=_RELIES_ON,
        refuses_when=_under_several_replicas, fixed_upstream=_FIXED_UPSTREAM),
    Fix(issue=ISSUE, affects=_AFFECTS, owner=_TF_VARIABLE, attribute="_initialize",
        replacement=_initialize, relies_on=_RELIES_ON,  # add_variable's guard refuses
        fixed_upstream=_FIXED_UPSTREAM),
)
