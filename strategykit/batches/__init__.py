"""What a step's batch holds across the replicas: its real examples and their statistics.

`sk.shard` pads the final partial batch with copies of real examples (`marks`: a copy
carries the sample weight -0.0). The step being traced publishes its batch to the layers
it calls (`current_step`), so that synchronized batch norm (`moments`: mean and variance
over every replica's real examples) and activity regularizers (`activity`) count the
real examples only, as one device does. Public TensorFlow and Keras API only; the fixes
that publish the step and hand Keras's layers these numbers are in
`strategykit/upstream/`. Builds on TensorFlow and Keras only.
"""
