"""How a metric's state combines across replicas: `sk.combine_across_replicas`.

Holds the declarations of how each metric variable's per-replica copies combine (a sum,
Keras's default, or a maximum, a minimum, ...) and the combining itself, in public
TensorFlow and Keras API only. The fix that applies them in Keras's steps is
`strategykit/upstream/exact_metrics.py`. Builds on TensorFlow and Keras only.
"""
