"""keras-team/keras#20134: Keras 3.8 takes every distributed dataset in `fit()`.

`sk.shard` makes its datasets of a function source, of uneven per-replica batches and
of TFDS with `strategy.distribute_datasets_from_function`, whose result is a
`DistributedDatasetsFromFunction`. Keras 3.8's `data_adapters.is_tf_dataset` knows only
`DistributedDataset`, so `fit()`, `evaluate()` and `predict()` fail with `Unrecognized
data type: x=<...DistributedDatasetsFromFunction ...>`; its `TFDatasetAdapter` takes
both already. Keras 3.9 added the class name (keras-team/keras#20829), nothing else in
the data adapters changed; this fix does the same on Keras 3.8 and is not installed
where Keras knows it.
"""

from __future__ import annotations

from strategykit.made import model_scope
from strategykit.pinning.fix import Fix, original, resolve

_ADAPTERS = "keras.src.trainers.data_adapters"


def _is_tf_dataset(x) -> bool:
    """Keras's `is_tf_dataset`, and True for a `DistributedDatasetsFromFunction` that
    `sk.shard` made too."""
    return ((_made_by_function(x) and model_scope.strategy_of(x) is not None)
            or original(resolve(_ADAPTERS), "is_tf_dataset")(x))


def _made_by_function(x) -> bool:
    return any(parent.__name__ == "DistributedDatasetsFromFunction"
               and parent.__module__.startswith("tensorflow.python.")
               for parent in type(x).__mro__)


FIXES = (
    Fix(
        issue="keras-team/keras#20134",
        affects="fit() of sk.shard data made by a function, TFDS or remainder='split'",
        owner=_ADAPTERS,
        attribute="is_tf_dataset",
        replacement=_is_tf_dataset,
        relies_on={
            f"{_ADAPTERS}:is_tf_dataset": "e8d15366aabb183a",  # Keras 3.8.0: replaced
            # reads it to choose TFDatasetAdapter, which takes both kinds of dataset
            f"{_ADAPTERS}:get_data_adapter": "e3a9553ce73bf261",
        },
        # None: where the fix cannot install, Keras's own code fails with its own error.
        refuses_when=None,
        # Keras 3.9.0 to 3.15.1: DistributedDatasetsFromFunction among its names
        fixed_upstream={f"{_ADAPTERS}:is_tf_dataset": "63a19bf724ffe56c"},
    ),
)
