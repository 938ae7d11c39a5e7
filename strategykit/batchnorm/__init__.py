"""Synchronized batch norm: `sk.SyncBatchNormalization` and `sk.convert_sync_batchnorm`.

Holds the moments over the global batch (one all-reduce), the Keras layer that uses
them, and the conversion of an existing model with its weights. Builds on Keras's
`BatchNormalization` and `ReplicaContext.all_reduce` only.
"""
