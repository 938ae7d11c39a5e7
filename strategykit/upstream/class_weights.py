"""Keras's `class_weight` on `sk.shard` data: weights multiplied in before distribution.

`fit(x, class_weight=...)` on a `tf.data` or distributed dataset makes Keras's
`TFDatasetAdapter` map its class-weight function over the dataset, which must then hold
`(x, y)` without sample weights. A distributed dataset has no `map` (`AttributeError:
'DistributedDataset' object has no attribute 'map'`), and `sk.shard`'s batches always
carry sample weights (on one replica too: `You cannot class_weight and sample_weight at
the same time`). tensorflow/tensorflow#41290 (tf.keras, closed unfixed); Keras 3.8.0
to 3.15.1 all do this.

The datasets `sk.shard` makes register how to remake themselves
(`strategykit.made.remade_data`). For such a dataset and a `class_weight`,
`TFDatasetAdapter.__init__` is handed that dataset remade with Keras's own class weights
(`make_class_weight_map_fn`, so the classes are read from `y` as one device reads them)
multiplied into every batch's weights before it is padded and distributed, and no
`class_weight`. Every other dataset goes to Keras's own code unchanged.
"""

from __future__ import annotations

import dataclasses

from strategykit.made.remade_data import remaker_of
from strategykit.pinning.fix import Fix, original, resolve

_ADAPTERS = "keras.src.trainers.data_adapters"
_TF_ADAPTER = f"{_ADAPTERS}.tf_dataset_adapter"


@dataclasses.dataclass(frozen=True)
class ClassWeights:
    """`fit()`'s `class_weight` as a weight per example of a batch: `weights(x, y)`.

    The classes are read from `y` by Keras's own code, as one device reads them: the
    argmax of one-hot labels, the rounded value of others. Call it in a `tf.data` map.

    Attributes:
        class_weight: `{class: weight}` as passed to `fit()`; a class not in it weighs 1.

    Example:
        >>> import tensorflow as tf
        >>> weights = ClassWeights({0: 0.5, 1: 2.0})
        >>> weights(None, tf.constant([1.0, 0.0, 1.0])).numpy().tolist()
        [2.0, 0.5, 2.0]
    """

    class_weight: dict

    def __call__(self, x, y):
        weigh = resolve(f"{_TF_ADAPTER}:make_class_weight_map_fn")(self.class_weight)
        return weigh(x, y)[2]


def _init_with_class_weights(self, dataset, class_weight=None, distribution=None):
    """Keras's `TFDatasetAdapter.__init__`; `sk.shard` data with a `class_weight` is
    remade with the class weights in its sample weights first."""
    remake = remaker_of(dataset) if class_weight is not None else None
    if remake is not None:
        dataset, class_weight = remake(class_weights=ClassWeights(class_weight)), None
    original(resolve(f"{_TF_ADAPTER}:TFDatasetAdapter"), "__init__")(
        self, dataset, class_weight=class_weight, distribution=distribution)


def _needs_the_fix(adapter, dataset, class_weight=None, distribution=None) -> bool:
    return class_weight is not None and remaker_of(dataset) is not None


FIXES = (
    Fix(
        issue="tensorflow/tensorflow#41290",
        affects="class_weight in fit() of sk.shard data",
        owner=f"{_TF_ADAPTER}:TFDatasetAdapter",
        attribute="__init__",
        replacement=_init_with_class_weights,
        relies_on={
            # replaced: maps make_class_weight_map_fn over the dataset (3.8.0 to 3.15.1)
            f"{_TF_ADAPTER}:TFDatasetAdapter.__init__": "e75ef40e705c7049",
            # called on (x, y): returns (x, y, weights), classes read from y
            f"{_TF_ADAPTER}:make_class_weight_map_fn": "1287bc2646f8ca6a",
            # hands fit()'s class_weight to TFDatasetAdapter for every tf.data or
            # distributed dataset (3.8.0 to 3.10.0; 3.11.0 to 3.14.1; 3.15.0 to 3.15.1,
            # which differ elsewhere: other data types, shuffle warnings)
            f"{_ADAPTERS}:get_data_adapter": (
                "e3a9553ce73bf261", "b66e725f96d40899", "738d79aa0ce79873"),
        },
        refuses_when=_needs_the_fix,
    ),
)
