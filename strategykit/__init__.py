"""strategykit: data-parallel Keras training across several devices, correct and visible.

Example:
    >>> import strategykit as sk
    >>> strategy = sk.mirrored(replicas=2)  # doctest: +SKIP
    >>> sk.describe(strategy)["replicas"]  # doctest: +SKIP
    2
"""

__version__ = "0.1.0"

# Before TensorFlow is imported, so before the API's imports; both standard library only.
# ruff: noqa: E402
from strategykit.cli.run_as_module import run_the_command_instead as _run_the_command_instead
from strategykit.launcher.tensorflow_log import filter_notebook_output as _filter_notebook_output

_run_the_command_instead()  # `python -m strategykit ARGS`: becomes the `strategykit` command
_filter_notebook_output()  # in a Jupyter kernel: TensorFlow's C++ log lines off the cells

from strategykit import callbacks
from strategykit.batchnorm.convert import convert_sync_batchnorm
from strategykit.batchnorm.layer import SyncBatchNormalization
from strategykit.cluster.roles import is_chief
from strategykit.data.replica_view import replica_batches
from strategykit.data.sharding import per_replica_batch_size, shard
from strategykit.data.stream import epochs
from strategykit.data.tfds_input import shard_tfds
from strategykit.equivalence.check import CheckReport, check
from strategykit.metrics.metric_state import combine_across_replicas
from strategykit.strategy.build import from_env, mirrored
from strategykit.strategy.describe import describe
from strategykit.strategy.learning_rate import scale_learning_rate
from strategykit.strategy.reduction import reduce

__all__ = [
    "__version__",
    "CheckReport",
    "SyncBatchNormalization",
    "callbacks",
    "check",
    "combine_across_replicas",
    "convert_sync_batchnorm",
    "describe",
    "epochs",
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
