"""XLA on several replicas: each replica's step compiled, the all-reduces outside.

`replica_steps` marks what each replica computes alone for XLA and keeps what crosses
replicas (all-reduces, the optimizer's update of every copy) with TensorFlow; it says
what `jit_compile="auto"` gives under a strategy (`sk.describe`'s `xla`). Public
TensorFlow and Keras API only; the fixes that build Keras's steps this way and decide
`"auto"` are in `strategykit/upstream/` (`xla_steps`, `steps_per_execution`,
`exact_predictions`). Builds on TensorFlow and Keras only.
"""
