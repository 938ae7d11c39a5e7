"""TensorFlow's step count of `distribute_datasets_from_function` datasets, corrected."""

from __future__ import annotations

import weakref

import tensorflow as tf

# -- TensorFlow: `distribute_datasets_from_function` counts batches, not steps --
#
# `DistributedDatasetsFromFunction.cardinality` counts the first input pipeline's
# per-replica batches, one per replica of the worker and step; Keras reads it as steps
# (`TFDatasetAdapter.num_batches`), so with R local replicas its bar counts to R x steps
# and every epoch ends with "Your input ran out of data". There is no public way to state
# the steps: `count_steps_not_batches` sets the private attribute the property returns,
# on `sk.shard`'s datasets only, with R > 1 and a known count, once per dataset. No
# upstream issue found; checked on TensorFlow 2.21.0; tests/test_upstream.py fails when
# the property changes or TensorFlow counts steps itself.
STEPS_RELIES_ON = {
    "tensorflow.python.distribute.input_lib:DistributedDatasetsFromFunction.cardinality":
        "4fc1797ea35ad1b2",
}
_COUNTED = weakref.WeakSet()


def count_steps_not_batches(distributed, strategy: tf.distribute.Strategy) -> None:
    """Makes `distributed.cardinality` the number of steps, as Keras reads it.

    Args:
        distributed: a dataset made by `strategy.distribute_datasets_from_function`
            whose pipelines yield one per-replica batch per replica and step.
        strategy: its strategy.
    """
    local_replicas = len(strategy.extended.worker_devices)
    batches = int(distributed.cardinality)
    if local_replicas > 1 and batches >= 0 and distributed not in _COUNTED:
        distributed._cardinality = batches // local_replicas
        _COUNTED.add(distributed)
