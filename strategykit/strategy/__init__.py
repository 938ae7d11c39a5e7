"""Building and describing strategies: `sk.mirrored`, `sk.from_env`, `sk.describe`.

Holds the local devices (logical CPUs and virtual GPUs when there are too few),
the strategy builders, `sk.describe`, `sk.reduce` for custom loops and
`sk.scale_learning_rate`. Builds on `tf.distribute`, on `strategykit.cluster` for the
cluster a job runs in, and installs `strategykit.upstream`'s fixes with each strategy.
"""
