"""`model.predict()` of `sk.shard` data: every example once, in the data's order.

`sk.shard` pads the final partial batch with copies of real examples (features-only data
cannot even mark them), and shuffles; Keras's `predict()` concatenates every replica's
outputs, copies included. So every dataset `sk.shard` makes also knows how to make the
same data *indexed* (`batching`): every batch `(batch, indices)`, each slot's index
among the examples as they come from the source, before any shuffle, -1 for a padded
copy. `predict()` of the dataset (hooked by `strategykit.upstream.exact_predictions`)
runs Keras's own `predict()` over the indexed data, with the model's `predict_function`
handed each step's batches without the indices, while the indices are joined as Keras
joins the outputs; then it keeps the rows of real examples, ordered by their indices:
the order of the arrays or `tf.data` dataset, of the dataset `fn(input_context)` returns
on one worker, of a TFDS split read unshuffled. Callbacks' `on_predict_batch_end` get
each step's outputs as Keras computes them, copies included.

Where no such order exists, `predict()` refuses with a `ValueError` (`refuse`): data
each worker reads its own part of (`fn(input_context)`, `sk.shard_tfds`) across several
workers, TFDS files read in a new order every pass, and part of a shuffled pass
(`drop_remainder=True`, or `predict(steps=...)` short of a pass), a random subset of
the examples that the predictions could not name.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from strategykit.cluster.environments import count_workers
from strategykit.cluster.roles import is_multi_worker
from strategykit.data.stream import EpochStream, attach_stream
from strategykit.upstream import exact_predictions, state_steps


def register(distributed, make_indexed, strategy, *, from_function: bool,
             steps: int | None, shuffle: bool, drop_remainder: bool,
             keyed_by_epoch: bool) -> None:
    """Makes `model.predict(distributed)` predict `make_indexed()` (made at the first
    call) and return each example's row once, in order; or refuse where no order exists.

    Args:
        distributed: a distributed dataset made by `sk.shard`.
        make_indexed: `make_indexed(continuous=False)` returns the same data indexed
            (with `continuous`, every epoch's pass after the other, for a `stream`).
        strategy: its strategy.
        from_function: whether the data comes from `fn(input_context)`.
        steps: the steps of a pass, when known.
        shuffle: whether the data is shuffled (only a whole pass can be put in order).
        drop_remainder: whether the final partial batch is dropped.
        keyed_by_epoch: whether the order of a pass depends on its epoch.
    """
    if from_function and is_multi_worker(strategy):
        refuse(distributed, across_workers_message(
            "sk.shard(fn(input_context))", strategy, "Pass arrays or an unbatched "
            "tf.data.Dataset to sk.shard for predict(): every worker reads them whole."))
        return
    pass_steps = steps
    made = []  # the indexed data and its concatenation, made at the first predict()

    def predict(model, keras_predict, *, steps=None, **options):
        partial = None
        if drop_remainder:
            partial = "drop_remainder=True"
        elif steps is not None and (pass_steps is None or steps < pass_steps):
            partial = f"predict(steps={steps}) of a pass of {pass_steps or 'unknown'} steps"
        if shuffle and partial:
            raise ValueError(
                "predict() of shuffled sk.shard data over part of a pass would predict a "
                "random subset of the examples, which its predictions, in the data's "
                f"order, could not name. Received: shuffle=True and {partial}. Shard the "
                "data for predict() with shuffle=False, or predict the whole pass "
                "(drop_remainder=False, steps=None).")
        if not made:
            made.extend([make_indexed(), exact_predictions.concatenation(strategy)])
            if pass_steps is not None:
                state_steps(made[0], pass_steps)
                if not is_multi_worker(strategy):  # predictions after the first start at once
                    attach_stream(made[0], EpochStream(
                        lambda: make_indexed(continuous=True), pass_steps,
                        keyed_by_epoch=keyed_by_epoch, element_spec=None, resumes=False))
        return _in_order(model, keras_predict, *made, steps=steps, **options)

    exact_predictions.register(distributed, predict)


def _in_order(model, keras_predict, indexed, concat, **options):
    """Keras's `predict()` of the `indexed` data: one row per example, in order."""
    model.make_predict_function()
    keras_function = model.predict_function
    indices = []

    def predict_function(execution):  # a list of steps' (batch, indices)
        indices.extend(concat(step_indices) for _, step_indices in execution)  # read at the end
        return keras_function([batch for batch, _ in execution])

    model.predict_function = predict_function
    try:
        outputs = keras_predict(indexed, **options)
    finally:
        model.predict_function = keras_function
    return in_data_order(outputs, np.concatenate(indices) if indices else np.zeros([0]))


def in_data_order(outputs, indices: np.ndarray):
    """The rows of `outputs` whose `indices` are not -1, ordered by their indices.

    Args:
        outputs: `predict()`'s outputs: an array, or a list or dict of them, one row
            per slot.
        indices: one per row: the example's index, -1 for a padded copy.

    Returns:
        `outputs` of the same structure, a row per example, in the examples' order.

    Raises:
        ValueError: the examples are not the first ones of the data (a prediction
            stopped early on shuffled data), or an output has not one row per slot.

    Example:
        >>> import numpy as np
        >>> in_data_order(np.array([10, 12, 11, -1]), np.array([0, 2, 1, -1])).tolist()
        [10, 11, 12]
    """
    real = np.flatnonzero(indices >= 0)
    order = real[np.argsort(indices[real], kind="stable")]
    if not np.array_equal(indices[order], np.arange(len(order))):
        raise ValueError(
            f"predict() of sk.shard data predicted {len(order)} examples that are not the "
            f"data's first {len(order)}, so its predictions cannot be put in the data's "
            "order (a predict() stopped early on shuffled data). Received: predictions "
            f"of the examples at {sorted(indices[order].tolist())[:10]}... of the data. "
            "Predict the whole data, or shard it with shuffle=False for predict().")

    def rows(output):
        if len(output) != len(indices):
            raise ValueError(
                f"predict() of sk.shard data needs one output row per example to leave out "
                f"the padded copies of its final batch. Received: an output of "
                f"{len(output)} rows for {len(indices)} examples. Return one row per "
                "example from the model (or predict_step).")
        return output[order] if isinstance(output, np.ndarray) else tf.gather(output, order)

    return tf.nest.map_structure(rows, outputs)


def refuse(distributed, message: str) -> None:
    """Makes `model.predict(distributed)` raise `ValueError(message)`."""

    def refusal(model, keras_predict, **options):
        raise ValueError(message)

    exact_predictions.register(distributed, refusal)


def across_workers_message(what: str, strategy, fix: str) -> str:
    """The refusal of data each worker reads its own part of, across several workers."""
    workers = count_workers(strategy.cluster_resolver.cluster_spec().as_dict())
    return (
        f"predict() cannot put the predictions of {what} in order across several "
        "workers: each worker's input pipeline reads its own part of the data, and no "
        f"worker knows the order of the others'. Received: {what} under {workers} "
        f"workers. {fix}")


def shuffled_files_message(what: str) -> str:
    """The refusal of a source that reads its files in a new order every pass."""
    return (
        f"predict() cannot put the predictions of {what} in the split's order: TFDS reads "
        f"its files in a new order every pass. Received: {what} with shuffle=True. Shard "
        "the split for predict() with shuffle=False.")
