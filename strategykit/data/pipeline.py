"""The tf.data pipeline behind `sk.shard` and `sk.shard_tfds`: shuffle, augment, batch.

`make_pipeline` turns unbatched examples into the batches one input pipeline feeds its
replicas (see `strategykit.data.batching` for the final partial batch).
"""

from __future__ import annotations

import tensorflow as tf

from strategykit.data.batching import batch_for_replicas


def make_pipeline(examples, size=None, context=None, *, global_batch_size, remainder,
                  replicas=None, shuffle=False, seed=None, shuffle_buffer=None, augment=None,
                  every_replica=False):
    """Shuffles and batches unbatched examples; used by `shard` and `shard_tfds`.

    With an input `context` (`distribute_datasets_from_function`) the result is this
    pipeline's per-replica batches, and tf.data's auto-sharding is off: the examples are
    this pipeline's own, or, with `every_replica`, every example, of which the pipeline
    keeps its own replicas' slices of each global batch (as one pipeline would give
    them). Without a context (`experimental_distribute_dataset`) it is global batches for
    `replicas` replicas, sharded by data (`DATA`) over several workers.
    """
    options = tf.data.Options()
    policy = tf.data.experimental.AutoShardPolicy
    options.experimental_distribute.auto_shard_policy = policy.OFF if context else policy.DATA
    if shuffle:
        examples = examples.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    if augment is not None:
        examples = _augmented(examples, augment, seed, None if every_replica else context)
    if size is None:
        size = _known_size(examples)
    batch_size = global_batch_size
    if context is not None:
        replicas = context.num_replicas_in_sync
        if not every_replica:
            replicas //= context.num_input_pipelines
        batch_size = context.get_per_replica_batch_size(global_batch_size) * replicas
    batches = batch_for_replicas(
        examples, pipeline_batch_size=batch_size, replicas=replicas, remainder=remainder,
        per_replica=context is not None, size=size,
    )
    if every_replica:
        batches = _own_replicas(batches, context)
    return batches.prefetch(tf.data.AUTOTUNE).with_options(options)


def _known_size(examples: tf.data.Dataset) -> int | None:
    """The number of examples when tf.data knows it (a function's dataset, say)."""
    if not tf.executing_eagerly():
        return None
    cardinality = int(examples.cardinality())
    return cardinality if cardinality >= 0 else None


def _own_replicas(batches: tf.data.Dataset, context) -> tf.data.Dataset:
    """This pipeline's replicas' batches, of every replica's batches in replica order."""
    pipelines, replicas = context.num_input_pipelines, context.num_replicas_in_sync
    if pipelines == 1:
        return batches
    local, index = replicas // pipelines, context.input_pipeline_id
    count = int(batches.cardinality())
    own = batches.enumerate().filter(
        lambda i, _: (i % replicas) // local == index).map(lambda _, batch: batch)
    return own.apply(tf.data.experimental.assert_cardinality(count // pipelines)) if (
        count >= 0) else own


def _augmented(examples, augment, seed, context):
    """`augment(example, seed)` with a fresh, reproducible stateless seed per example."""
    pipeline = context.input_pipeline_id if context is not None else 0
    seeds = tf.data.Dataset.random(
        seed=None if seed is None else seed + 7919 * pipeline,
        rerandomize_each_iteration=True,
    ).batch(2, drop_remainder=True)
    return tf.data.Dataset.zip((examples, seeds)).map(
        augment, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
