"""strategykit: data-parallel Keras training across several devices, correct and visible.

Example:
    >>> import strategykit as sk
    >>> strategy = sk.mirrored(replicas=2)  # doctest: +SKIP
    >>> sk.describe(strategy)["replicas"]  # doctest: +SKIP
    2
"""

__version__ = "0.1.0"

from strategykit import callbacks
from strategykit.check import CheckReport, check
from strategykit.cluster import is_chief
from strategykit.convert import convert_sync_batchnorm
from strategykit.describe import describe
from strategykit.learning_rate import scale_learning_rate
from strategykit.reduction import reduce
from strategykit.sharding import per_replica_batch_size, replica_batches, shard
from strategykit.strategy import from_env, mirrored
from strategykit.sync_bn import SyncBatchNormalization
from strategykit.tfds_input import shard_tfds

__all__ = [
    "__version__",
    "CheckReport",
    "SyncBatchNormalization",
    "callbacks",
    "check",
    "convert_sync_batchnorm",
    "describe",
    "from_env",
    "is_chief",
    "mirrored",
    "per_replica_batch_size",
    "reduce",
    "replica_batches",
    "scale_learning_rate",
    "shard",
    "shard_tfds",
]
