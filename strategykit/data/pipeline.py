"""The tf.data pipeline behind `sk.shard` and `sk.shard_tfds`: shuffle, augment, batch.

`make_pipeline` turns unbatched examples into the batches one input pipeline feeds its
replicas (see `strategykit.data.batching` for the final partial batch).
"""

from __future__ import annotations

import tensorflow as tf

from strategykit.data import position
from strategykit.data.batching import batch_examples, count_batches, for_replicas
from strategykit.data.own_functions import runs_users_functions, traced_as_written


def make_pipeline(examples, size=None, context=None, *, global_batch_size, remainder,
                  replicas=None, shuffle=False, seed=None, shuffle_buffer=None, augment=None,
                  every_replica=False, steps=None, specs=None, continuous=False,
                  class_weights=None, preprocess=None, indexed=False):
    """Shuffles and batches unbatched examples; used by `shard` and `shard_tfds`.

    With an input `context` (`distribute_datasets_from_function`) the result is this
    pipeline's per-replica batches, and tf.data's auto-sharding is off: the examples are
    this pipeline's own, or, with `every_replica`, every example, of which the pipeline
    keeps its own replicas' slices of each global batch (as one pipeline would give
    them). Without a context (`experimental_distribute_dataset`) it is global batches for
    `replicas` replicas, sharded by data (`DATA`) over several workers.

    Every pass starts at the training position (`strategykit.data.position`): with a
    `seed`, its epoch keys the shuffle order and the augmentation seeds, and a resumed
    epoch skips the steps done before the interruption. tf.data then no longer knows the
    number of batches; when it is known it is appended to the list `steps`, for the caller to
    state to Keras; the spec of a step's element is appended to the list `specs`. With
    `continuous`, one pass of the result is every epoch's pass from the current one on
    (`position.positioned`). `class_weights` multiplies every batch's weights, and
    `preprocess` (keras-hub's) turns every batch into the model's inputs first
    (`batching.for_replicas`, mapped once after the passes, not in each). With `indexed`
    (for `predict()`), every batch is `(batch, indices)`: each slot's index among the
    examples in the order they come, -1 for a padded copy; a pass then starts at its
    epoch's first step whatever a resumed run skips (which is the next `fit()`'s).
    """
    options = tf.data.Options()
    policy = tf.data.experimental.AutoShardPolicy
    options.experimental_distribute.auto_shard_policy = policy.OFF if context else policy.DATA
    if size is None:
        size = _known_size(examples)
    batch_size = global_batch_size
    if context is not None:
        replicas = context.num_replicas_in_sync
        if not every_replica:
            replicas //= context.num_input_pipelines
        batch_size = context.get_per_replica_batch_size(global_batch_size) * replicas
    count = count_batches(size, batch_size, replicas, remainder) if size is not None else None

    if indexed:
        examples = examples.enumerate()  # (index, example), numbered before any shuffle
    if shuffle and seed is None:  # a new order every pass, not reproducible
        examples = examples.shuffle(shuffle_buffer, reshuffle_each_iteration=True)
    if augment is not None and seed is None:
        examples = _augmented(examples, augment, None, None, None if every_replica else context,
                              indexed)

    def one_pass(epoch):
        shuffled = examples
        if seed is not None:
            # The seed and the epoch alone decide: a global seed (tf.random.set_seed)
            # would combine with them, and trips over a seed that is a tensor.
            tf.compat.v1.set_random_seed(None)  # of this function's graph only
            if shuffle:
                shuffled = shuffled.shuffle(shuffle_buffer, seed=_epoch_seed(seed, epoch),
                                            reshuffle_each_iteration=False)
            if augment is not None:
                shuffled = _augmented(shuffled, augment, seed, epoch,
                                      None if every_replica else context, indexed)
        return batch_examples(shuffled, pipeline_batch_size=batch_size, replicas=replicas,
                              remainder=remainder, size=size)

    if count is not None and steps is not None:
        steps.append(count)
    batches = position.positioned(one_pass, continuous=continuous, resumes=not indexed,
                                  autograph=runs_users_functions(augment=augment))
    batches = for_replicas(
        batches, pipeline_batch_size=batch_size, replicas=replicas, remainder=remainder,
        per_replica=context is not None, class_weights=class_weights, preprocess=preprocess,
        indexed=indexed)
    if every_replica:
        batches = _own_replicas(batches, context)
    if specs is not None:
        specs.append(batches.element_spec)
    return batches.prefetch(tf.data.AUTOTUNE).with_options(options)


def _epoch_seed(seed, epoch):
    """The shuffle seed of an epoch: the same for every pass of that epoch."""
    return None if seed is None else tf.constant(seed, tf.int64) * 1_000_003 + epoch


def _known_size(examples: tf.data.Dataset) -> int | None:
    """The number of examples when tf.data knows it (a function's dataset, say)."""
    if not tf.executing_eagerly():
        return None
    cardinality = int(examples.cardinality())
    return cardinality if cardinality >= 0 else None


def _own_replicas(batches: tf.data.Dataset, context) -> tf.data.Dataset:
    """This pipeline's replicas' batches, of every replica's batches in replica order
    (every step is one batch for each replica, so the order holds across passes)."""
    pipelines, replicas = context.num_input_pipelines, context.num_replicas_in_sync
    if pipelines == 1:
        return batches
    local, index = replicas // pipelines, context.input_pipeline_id
    return batches.enumerate().filter(
        traced_as_written(lambda i, _: (i % replicas) // local == index)).map(
        traced_as_written(lambda _, batch: batch))


def _augmented(examples, augment, seed, epoch, context, indexed=False):
    """`augment(example, seed)` with a fresh stateless seed per example (of each
    `(index, example)` pair when `indexed`).

    With a `seed`, the seeds of an epoch depend on it, the epoch and the pipeline only;
    without, they are new every pass."""
    pipeline = context.input_pipeline_id if context is not None else 0
    seeds = tf.data.Dataset.random(
        seed=None if seed is None else (seed + 7919 * pipeline) * 1_000_003 + epoch,
        rerandomize_each_iteration=seed is None,
    ).batch(2, drop_remainder=True)
    step = augment if not indexed else (
        lambda pair, seed: (pair[0], augment(pair[1], seed)))  # the index left as it is
    return tf.data.Dataset.zip((examples, seeds)).map(
        step, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
