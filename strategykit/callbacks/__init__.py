"""Keras callbacks for multi-replica training: per-replica losses, plots, backups.

Example:
    >>> import strategykit as sk
    >>> callbacks = [sk.callbacks.CrossReplicaLoss(), sk.callbacks.LossPlot(path="loss.png")]
"""

from strategykit.callbacks.backup_and_restore import BackupAndRestore
from strategykit.callbacks.cross_replica_loss import CrossReplicaLoss
from strategykit.callbacks.loss_plot import LossPlot
from strategykit.callbacks.nan_guard import NonFiniteError

__all__ = ["BackupAndRestore", "CrossReplicaLoss", "LossPlot", "NonFiniteError"]
