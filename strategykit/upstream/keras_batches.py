"""Data that Keras batches itself, trained on under a strategy of strategykit's: refused
where it would train differently from one device (keras-team/keras, unreported).

Under several replicas Keras splits each batch of arrays (`fit(x, y, batch_size=B)`)
over the replicas, and each replica averages the loss over its own examples: on a final
batch of fewer than B examples (13 over 4 replicas: 4, 3, 3, 3) the gradient is not one
device's (a Dense regression 5e-2 away after 2 epochs of 61 examples in batches of 16).
A `keras.utils.PyDataset` trains on other batches than one device on every step (7e-2
away with full batches). `sk.shard` pads the final batch and weighs its examples, so
training is exact there. `fit()` of such data on a strategy strategykit made or sharded
for, of several replicas, is refused before its first step, naming the fix: the
`TrainingData` callback (added to every such fit, `every_fit`) checks, in
`on_train_begin`, the data adapter that `multi_worker`'s build noted (`note`).
`evaluate()` and `predict()` of them are one device's, and run; arrays whose size is a
multiple of the batch train exactly, and run.
"""

from __future__ import annotations

import weakref

import keras

_ADAPTERS = weakref.WeakKeyDictionary()  # model -> the data adapter of its last build
_DATA = weakref.WeakKeyDictionary()  # model -> the distributed dataset of its last build


def note(model, epoch_iterator) -> None:
    """Records the data adapter of the epoch iterator `model` is built for (in `fit()`,
    `evaluate()`), for `TrainingData` to check at the start of training."""
    adapter = getattr(epoch_iterator, "data_adapter", None)
    if adapter is not None:
        _ADAPTERS[model] = adapter
    _DATA[model] = getattr(epoch_iterator, "_distributed_dataset", None)


def last_data(model):
    """The distributed dataset (`sk.shard`'s, say) `model` was last built for in `fit()`
    or `evaluate()` on a strategy of strategykit's; None for other data or strategies."""
    return _DATA.get(model)


class TrainingData(keras.callbacks.Callback):
    """Refuses, before the first step of `fit()` on several replicas, data that Keras
    batches itself and that would train differently from one device."""

    async_safe = True

    def on_train_begin(self, logs=None):
        adapter = _ADAPTERS.get(self.model)
        replicas = self.model.distribute_strategy.num_replicas_in_sync
        kind = type(adapter).__name__
        if replicas == 1 or kind not in ("PyDatasetAdapter", "ArrayDataAdapter"):
            return
        if kind == "PyDatasetAdapter":
            raise ValueError(
                f"model.fit() of a keras.utils.PyDataset on {replicas} replicas trains on "
                "other batches than one device: Keras splits a PyDataset's batches over the "
                "replicas without knowing their size. Received: x of type PyDataset. Make "
                "its examples a tf.data.Dataset (tf.data.Dataset.from_generator(..., "
                "output_signature=...), unbatched) and pass sk.shard(dataset, strategy, "
                "global_batch_size=...) to fit().")
        if adapter.has_partial_batch:
            batch, final = adapter.batch_size, adapter.partial_batch_size
            examples = (adapter.num_batches - 1) * batch + final
            raise ValueError(
                f"model.fit() of {examples} examples in batches of {batch} on {replicas} "
                f"replicas would not train as one device: Keras splits the final batch of "
                f"{final} over the replicas and each averages the loss over its own "
                f"examples. Received: {examples} examples, batch_size={batch}. Pass "
                f"sk.shard((x, y), strategy, global_batch_size={batch}) to fit() (it pads "
                "the final batch and weighs its examples: exact), or a number of examples "
                f"that is a multiple of {batch}.")
