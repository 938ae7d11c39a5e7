"""TensorFlow's step count of `distribute_datasets_from_function` datasets, corrected."""

from __future__ import annotations

from strategykit.pinning.pinned_access import PinnedAccess

# -- Keras reads a distributed dataset's steps from a count tf.data may not know --
#
# Keras takes the steps of an epoch from `DistributedDataset.cardinality`
# (`TFDatasetAdapter.num_batches`). `sk.shard`'s pipelines start each pass at the training
# position (a resumed epoch skips the steps it did), so tf.data cannot count their
# batches; and `DistributedDatasetsFromFunction.cardinality` counts a pipeline's
# per-replica batches, one per replica of the worker and step, which Keras would read as
# R x steps with R local replicas. There is no public way to state the steps:
# `state_steps` sets the private attribute both properties return, on `sk.shard`'s
# datasets only. No upstream issue found; pinned on TensorFlow 2.18.1, 2.20.0 and 2.21.0;
# on unknown code `sk.shard` refuses (Keras would run R x the steps).
_INPUT_LIB = "tensorflow.python.distribute.input_lib"
STEPS = PinnedAccess(
    issue="tensorflow/tensorflow (unreported)",
    affects="the steps of an epoch of sk.shard data",
    relies_on={f"{_INPUT_LIB}:DistributedDatasetsFromFunction.cardinality": "4fc1797ea35ad1b2",
               f"{_INPUT_LIB}:DistributedDataset.cardinality": "4fc1797ea35ad1b2"},
    refuses=True)
PINNED = (STEPS,)


def state_steps(distributed, steps: int) -> None:
    """Makes `distributed.cardinality`, as Keras reads it, `steps`.

    Args:
        distributed: a dataset made by `strategy.experimental_distribute_dataset` or
            `strategy.distribute_datasets_from_function`.
        steps: its steps per pass (an epoch of `fit()`).

    Raises:
        UnknownUpstreamCode: where TensorFlow's code is not the code pinned.
    """
    STEPS.require()
    distributed._cardinality = int(steps)
