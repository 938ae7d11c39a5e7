"""Per-replica batches of one input pipeline: sample weights, and the final partial batch.

`sk.shard` turns every input into a stream of unbatched examples per input pipeline;
`batch_examples` batches each pass of them, and `for_replicas` appends a sample weight to
every example of a batch and cuts it for the replicas that pipeline feeds. The final
partial batch is handled in one of three ways:

* **pad** (default): the final global batch of `r` real examples is filled up to the full
  global batch with copies of real examples that carry `sample_weight == -0.0` (see
  `strategykit.upstream.exact_metrics`, which keeps them out of Keras's metrics). The real
  examples are spread as evenly as possible over the replicas, in order (replica `k` gets
  the next `r // N` or `r // N + 1`), so no replica ever gets an empty batch, and they
  carry `sample_weight == global_batch_size / r`. With a loss reduced by
  `"sum_over_batch_size"` (the Keras default), Keras' per-replica mean and its 1/N
  replica scaling then give exactly the mean loss (and gradient) over the `r` real
  examples, as one device training on those `r` examples would.
* **split**: nothing is padded and every weight is 1. The final
  partial batch is spread as evenly as possible over the replicas, in order, so no
  replica is empty when it holds at least one example per replica. When it holds fewer
  (and the size of the data is known), it joins the batch before it, which then
  spreads `global_batch_size + r` examples. Loss, `metrics` and `weighted_metrics` of
  `evaluate()` are then exactly those over every example once, and no replica runs an
  empty batch (which TensorFlow's CPU convolutions get wrong). Training this way is not
  exact: replicas of unequal size are averaged with equal weight.
* **drop**: the final partial batch is dropped.

Full batches always carry `sample_weight == 1` (times a weight the user passed). The
weights are one per example, shaped to broadcast over per-pixel losses (`weight_rank`).

For `predict()`, examples can come *indexed*, as `(index, example)` pairs: every batch is
then `(batch, indices)`, each slot's index into the pipeline's examples, -1 for a padded
copy (`strategykit.data.predict_input`).
"""

from __future__ import annotations

import tensorflow as tf

from strategykit.batches.marks import pad_weights_like
from strategykit.data.own_functions import traced_as_written

WEIGHT_DTYPE = tf.float64
"""The sample weights' dtype. A padded batch's real examples carry `global batch / r`,
which float32 rounds (16 / 6); Keras casts the weights to the loss's dtype, so a float64
model trains with the exact scale, and a float32 one rounds it as float32 would."""


def split_labels(element):
    """Splits an example into `(x, y, sample_weight)`; `y` and the weight may be None.

    A tuple of 2 or 3 is `(x, y)` or `(x, y, sample_weight)` as in Keras; anything else
    (an array, a dict, a 1-tuple) is features only.
    """
    if isinstance(element, tuple) and not hasattr(element, "_fields"):
        if len(element) == 1:
            return element[0], None, None
        if len(element) in (2, 3):
            return (*element, None)[:3]
    return element, None, None


def batch_examples(examples: tf.data.Dataset, *, pipeline_batch_size: int, replicas: int,
                   remainder: str, size: int | None = None) -> tf.data.Dataset:
    """One pass of one pipeline's examples in batches of a step, nothing added yet.

    Args:
        examples: unbatched examples: `(x, y)`, `(x, y, sample_weight)` or features `x`.
        pipeline_batch_size: examples per step for this pipeline (all its replicas).
        replicas: replicas this pipeline feeds; `pipeline_batch_size` is a multiple.
        remainder: `"pad"`, `"split"` or `"drop"`.
        size: the number of examples of this pipeline, when known (`"split"` uses it).

    Returns:
        A dataset of one batch per step (the final one partial, or joined to the one
        before by `"split"`), of known cardinality when `size` is known; `for_replicas`
        then weighs, pads and cuts each.
    """
    if remainder == "split":
        batches = _batches_without_tiny_remainder(examples, pipeline_batch_size, replicas, size)
    else:
        batches = examples.batch(pipeline_batch_size, drop_remainder=remainder == "drop")
    if size is None:
        return batches
    # Grouping loses tf.data's count of the batches; state it, so that Keras knows the
    # number of steps (no "ran out of data", a progress bar of N/N).
    return batches.apply(tf.data.experimental.assert_cardinality(
        count_batches(size, pipeline_batch_size, replicas, remainder)))


def for_replicas(
    batches: tf.data.Dataset,
    *,
    pipeline_batch_size: int,
    replicas: int,
    remainder: str,
    per_replica: bool,
    class_weights=None,
    preprocess=None,
    indexed: bool = False,
) -> tf.data.Dataset:
    """The batches of `batch_examples`, with sample weights, padded, for the replicas.

    Each batch is turned on its own, whatever epoch it comes from: a pipeline of many
    epochs (`position.positioned`) maps this once, after its passes, rather than in each
    pass, so that a large function (keras-hub's tokenizer) is made ready once per
    iterator, not again every pass.

    Args:
        batches: batches of a step, as `batch_examples` makes them.
        pipeline_batch_size: examples per step for this pipeline (all its replicas).
        replicas: replicas this pipeline feeds; `pipeline_batch_size` is a multiple.
        remainder: `"pad"`, `"split"` or `"drop"`, as the batches were made.
        per_replica: cut every batch into per-replica batches (for
            `distribute_datasets_from_function`); otherwise the batches are global
            (for `experimental_distribute_dataset`, which cuts them itself).
        class_weights: None, or a function `(x, y) -> weights` of a batch, one per
            example (Keras's `class_weight`), multiplied into the weights before the
            batch is padded: a padded copy keeps its weight -0.0.
        preprocess: None, or a function `(x, y, sample_weight) -> batch` (keras-hub's
            `preprocess_samples`: a tokenizer, say) run on every batch first, before
            its weights; it may make the labels and weights (a causal LM's next tokens
            and padding mask), which are then weighted and padded as given ones.
            AutoGraph converts the batch function then, as tf.data converts a user's;
            strategykit's own are traced as written (`own_functions`).
        indexed: the batches are of `(index, example)` pairs; each batch is then
            `(batch, indices)`, with index -1 for a padded copy.

    Returns:
        A dataset of batches `(x, y, w)`, or `x` for features-only data (which cannot
        carry weights: its padded copies are not marked), or with `indexed`
        `(batch, indices)`; `replicas` elements a step when `per_replica`.
    """
    pad = remainder == "pad"

    def weigh(*element):
        element = element[0] if len(element) == 1 else element
        indices, element = element if indexed else (None, element)
        if preprocess is not None:
            element = preprocess(*split_labels(element))
        x, y, user_weight = split_labels(element)
        if y is None:
            batch = x
        else:
            size = tf.shape(tf.nest.flatten(x)[0])[0]
            rank = weight_rank(y, user_weight)
            weight = _to_rank(tf.ones([size], WEIGHT_DTYPE), rank)
            if user_weight is not None:
                weight = _to_rank(tf.cast(user_weight, WEIGHT_DTYPE), rank) * weight
            if class_weights is not None:
                weight = _to_rank(tf.cast(class_weights(x, y), WEIGHT_DTYPE), rank) * weight
            batch = (x, y, weight)
        if pad:
            return _pad(batch, pipeline_batch_size, replicas, weighted=y is not None,
                        indices=indices)
        return batch if indices is None else (batch, indices)

    if preprocess is None:
        weigh = traced_as_written(weigh)
    batches = batches.map(weigh, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    if not per_replica:
        return batches
    if remainder == "split":
        return split_evenly(batches, replicas)
    return batches.rebatch(pipeline_batch_size // replicas)


def weight_rank(y, user_weight=None) -> int:
    """The rank of the sample weights `for_replicas` gives batches of labels `y`.

    Keras multiplies a sample weight into the per-element losses and lines the two up
    only when their ranks differ by at most one. Labels of rank 3 or more (per-pixel
    classes `(B, H, W)`, one-hot maps `(B, H, W, C)`) have losses of rank 3 or more, so
    their weights are `(B, 1, 1[, 1])`, of the labels' rank: one per example, broadcast
    over its pixels. Otherwise one weight per example, `(B,)`, as Keras expects. A
    weight the user passed keeps its own rank when it is larger (per-pixel weights).
    Labels that are a structure (several outputs) get `(B,)`.

    Example:
        >>> import tensorflow as tf
        >>> weight_rank(tf.zeros([8, 16, 16])), weight_rank(tf.zeros([8, 10]))
        (3, 1)
    """
    label_rank = y.shape.rank if isinstance(y, tf.Tensor) and y.shape.rank else 1
    user_rank = user_weight.shape.rank if user_weight is not None else 1
    return max(label_rank if label_rank >= 3 else 1, user_rank or 1)


def _to_rank(weight, rank: int):
    """`weight` with trailing axes of size 1 added up to `rank`."""
    missing = rank - weight.shape.rank
    if missing == 0:  # already of that rank: nothing to trace
        return weight
    return tf.reshape(weight, tf.concat([tf.shape(weight), tf.ones([missing], tf.int32)], 0))


def count_batches(size: int, batch_size: int, replicas: int, remainder: str) -> int:
    """How many batches `batch_examples` makes of `size` examples (one per step).

    Example:
        >>> count_batches(10, 4, replicas=2, remainder="pad")
        3
        >>> count_batches(9, 4, replicas=2, remainder="split")  # 1 example joins the 2nd
        2
        >>> count_batches(10, 4, replicas=2, remainder="drop")
        2
    """
    full, extra = divmod(size, batch_size)
    if remainder == "drop" or (remainder == "split" and 0 < extra < replicas and full):
        return full
    return full + (extra > 0)


def split_evenly(batches: tf.data.Dataset, replicas: int) -> tf.data.Dataset:
    """Cuts every batch into `replicas` consecutive per-replica batches, in order.

    Sizes differ by at most one (the first replicas get the extra examples), so no
    replica is empty while the batch holds at least one example per replica.
    """

    def pieces(*element):
        element = element[0] if len(element) == 1 else element
        size = tf.shape(tf.nest.flatten(element)[0])[0]
        base, extra = size // replicas, size % replicas

        def piece(replica):
            replica = tf.cast(replica, tf.int32)
            start = replica * base + tf.minimum(replica, extra)
            end = start + base + tf.cast(replica < extra, tf.int32)
            return tf.nest.map_structure(lambda t: t[start:end], element)

        return tf.data.Dataset.range(replicas).map(piece)

    return batches.flat_map(traced_as_written(pieces))


def _batches_without_tiny_remainder(examples, batch_size: int, replicas: int, size):
    """Batches of `batch_size`; a final remainder smaller than `replicas` joins the one
    before it (when `size`, the number of examples, is known and there is one before)."""
    remainder = size % batch_size if size is not None else 0
    if not 0 < remainder < replicas or size < batch_size:
        return examples.batch(batch_size)
    last = size // batch_size - 1

    def key(index, _):
        return tf.minimum(index // batch_size, last)

    def window_size(key):
        return tf.where(key == last, tf.cast(batch_size + remainder, tf.int64),
                        tf.cast(batch_size, tf.int64))

    def batch_window(_, window):
        return window.map(lambda index, element: element).batch(batch_size + remainder)

    return examples.enumerate().group_by_window(key, batch_window,
                                                window_size_func=window_size)


def _pad(batch, batch_size: int, replicas: int, *, weighted: bool = False, indices=None):
    """The batch itself when full, else the padded, spread layout (see module docstring);
    `(batch, indices)` when the examples' `indices` are given (-1 for a padded copy)."""
    element = batch if indices is None else (batch, indices)
    size = tf.shape(tf.nest.flatten(element)[0])[0]

    def padded():
        reads, real = spread_indices(size, batch_size, replicas)
        out = tf.nest.map_structure(lambda t: tf.gather(t, reads), batch)
        if weighted:
            x, y, weight = out
            scale = tf.cast(batch_size, WEIGHT_DTYPE) / tf.cast(size, WEIGHT_DTYPE)
            flags = _to_rank(real, weight.shape.rank)  # one per example, over its pixels
            out = x, y, tf.where(flags, weight * scale, pad_weights_like(weight))
        if indices is None:
            return out
        return out, tf.where(real, tf.gather(indices, reads), tf.constant(-1, indices.dtype))

    full = tf.cond(size < batch_size, padded, lambda: element)
    # Every batch is full now: say so in the static shape. tf.distribute then takes the
    # plain `get_next` path rather than its slower partial-batch handling.
    return tf.nest.map_structure(
        lambda t: tf.ensure_shape(t, [batch_size, *t.shape[1:]]), full)


def spread_indices(size, batch_size: int, replicas: int):
    """Where each slot of a padded batch reads from, and whether it is a real example.

    Slot `j` belongs to replica `j // per_replica`. Replica `k` holds real examples
    `start_k .. start_k + count_k - 1` (counts as even as possible, in order), then
    copies of its own real examples, or of any real example when it has none.

    Returns:
        `(indices, real)`: int32 indices into the `size` real examples, and a bool mask.
    """
    per_replica = batch_size // replicas
    slot = tf.range(batch_size)
    replica, position = slot // per_replica, slot % per_replica
    base, extra = size // replicas, size % replicas
    count = base + tf.cast(replica < extra, tf.int32)
    start = replica * base + tf.minimum(replica, extra)
    real = position < count
    own_copy = start + position % tf.maximum(count, 1)
    indices = tf.where(count > 0, own_copy, slot % size)
    return indices, real

