"""The datasets a `tf.data` dataset is made from, through its private `_inputs()`.

tf.data has no public way to ask whether a dataset is batched: its `element_spec` looks
the same as one of variable-length examples. `sk.shard` walks the chain of
transformations (`strategykit.data.sources`) and looks at their class names
(`_BatchDataset`, `_PaddedBatchDataset`, ...); `input_datasets(dataset)` gives each link's
inputs. A `PinnedAccess`, pinned on TensorFlow 2.18.1, 2.20.0 and 2.21.0; on unknown
code it gives none, and only the outermost transformation is looked at.
"""

from __future__ import annotations

from strategykit.pinning.pinned_access import PinnedAccess

_DATASET_OPS = "tensorflow.python.data.ops.dataset_ops"

DATASET_INPUTS = PinnedAccess(
    issue="tensorflow/tensorflow (unreported)",
    affects="sk.shard's check that a tf.data dataset is not batched already",
    relies_on={f"{_DATASET_OPS}:DatasetV2._inputs": "d594274a9a6bf857",
               f"{_DATASET_OPS}:UnaryDataset._inputs": "3abd2dd495320d15"},
    refuses=False)

PINNED = (DATASET_INPUTS,)


def input_datasets(dataset) -> list:
    """The datasets `dataset` transforms (empty for a source, or on unknown code).

    Example:
        >>> import tensorflow as tf
        >>> batched = tf.data.Dataset.range(4).batch(2)
        >>> [type(parent).__name__ for parent in input_datasets(batched)]
        ['_RangeDataset']
    """
    return list(dataset._inputs()) if DATASET_INPUTS.known() else []
