"""Different data for each replica: `sk.shard` and `sk.shard_tfds`.

Holds where examples come from (arrays, datasets, functions), the per-replica batching
with its final partial batch, the shared tf.data pipeline, prepared TFDS datasets split
by files, the one long-lived iterator each dataset's epochs are read from (`stream`;
`sk.epochs` for custom loops), and the demo's packaged datasets. Builds on `tf.data` and
`strategy.distribute_datasets_from_function`, on `strategykit.cluster` for which worker
reads what, and on `strategykit.upstream` for the step count.
"""
