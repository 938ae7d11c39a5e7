"""Keras callbacks that make multi-replica training visible: per-replica losses, plots.

Example:
    >>> import strategykit as sk
    >>> callbacks = [sk.callbacks.CrossReplicaLoss(), sk.callbacks.LossPlot(path="loss.png")]
"""

from strategykit.callbacks.cross_replica_loss import CrossReplicaLoss
from strategykit.callbacks.loss_plot import LossPlot
from strategykit.callbacks.nan_guard import NonFiniteError

__all__ = ["CrossReplicaLoss", "LossPlot", "NonFiniteError"]
