"""The cost of sk.shard: iterating it against strategy.experimental_distribute_dataset.

Workload: 4 simulated replicas, 8x8x8 float32 images with integer labels, global batch
64, 100 steps of which the last is partial (so sk.shard pads it and adds weights).
First comparison: both variants iterate the distributed dataset one epoch at a time in
eager Python, as a custom training loop does; the time per step is the fastest of
several epochs. Second: `fit()` step time of the 20-layer conv net of
`workloads.conv_net` on 20 steps of the same kind of data.

    python benchmarks/sharding_overhead.py --pairs 5
"""

from __future__ import annotations

import harness
import workloads

STEPS = 100


def _setup(steps=STEPS):
    import numpy as np

    import strategykit as sk

    strategy = sk.mirrored(replicas=4)
    examples = workloads.GLOBAL_BATCH * (steps - 1) + 13
    rng = np.random.default_rng(0)
    x = rng.normal(size=(examples, 8, 8, 8)).astype("float32")
    y = rng.integers(0, 10, size=examples).astype("int32")
    return strategy, x, y


def sk_shard() -> float:
    import strategykit as sk

    strategy, x, y = _setup()
    ds = sk.shard((x, y), strategy, global_batch_size=workloads.GLOBAL_BATCH)
    return harness.iteration_step_seconds(lambda: ds)


def distribute_dataset() -> float:
    import tensorflow as tf

    strategy, x, y = _setup()
    plain = tf.data.Dataset.from_tensor_slices((x, y)).batch(workloads.GLOBAL_BATCH)
    ds = strategy.experimental_distribute_dataset(plain.prefetch(tf.data.AUTOTUNE))
    return harness.iteration_step_seconds(lambda: ds)


def _fit_seconds(make_dataset) -> float:
    strategy, x, y = _setup(workloads.STEPS)
    with strategy.scope():
        model = workloads.conv_net()
        model.compile("sgd", "sparse_categorical_crossentropy")
    return harness.fit_step_seconds(model, make_dataset(strategy, x, y), steps=workloads.STEPS)


def fit_sk_shard() -> float:
    import strategykit as sk

    return _fit_seconds(lambda strategy, x, y: sk.shard(
        (x, y), strategy, global_batch_size=workloads.GLOBAL_BATCH))


def fit_distribute_dataset() -> float:
    import tensorflow as tf

    def make(strategy, x, y):
        plain = tf.data.Dataset.from_tensor_slices((x, y)).batch(workloads.GLOBAL_BATCH)
        return strategy.experimental_distribute_dataset(plain.prefetch(tf.data.AUTOTUNE))

    return _fit_seconds(make)


if __name__ == "__main__":
    harness.main(
        __file__,
        {"sk_shard": sk_shard, "distribute_dataset": distribute_dataset,
         "fit_sk_shard": fit_sk_shard, "fit_distribute_dataset": fit_distribute_dataset},
        [("sk_shard", "distribute_dataset"), ("fit_sk_shard", "fit_distribute_dataset")],
    )
