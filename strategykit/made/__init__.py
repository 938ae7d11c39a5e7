"""What strategykit made: the strategies it built or sharded data for, and its datasets.

The fixes in `strategykit/upstream/` apply only to these: a Keras model of a strategy
strategykit did not make, fed data it did not make, runs as if strategykit were not
imported. `strategies` records each strategy `sk.mirrored()`, `sk.from_env()` build and
each one `sk.shard()` shards for; `remade_data` how each dataset `sk.shard` made is
remade with other batch options; `model_scope` the strategy of each such dataset.
Weak references only: a strategy or dataset the program drops is forgotten. Builds on
TensorFlow only.
"""
