"""Which batch norm layers of a model normalize over their own replica's batch only.

Such a layer computes other numbers whenever the number of replicas changes, since each
replica's share of the global batch changes; a synchronized one (`sk.SyncBatchNormalization`
or Keras's `synchronized=True`) does not. `sk.callbacks.BackupAndRestore` uses this to
say when a resume on another number of replicas cannot be exact.
"""

from __future__ import annotations

import keras

from strategykit.batchnorm.layer import SyncBatchNormalization


def unsynchronized_batch_norms(model: keras.Model, prefix: str = "") -> list[str]:
    """The names of the model's batch norm layers that are not synchronized.

    Nested models' layers are named `outer/inner`.

    Args:
        model: a Keras model.
        prefix: put before each name (used for nested models).

    Returns:
        The names, in `model.layers` order; empty when every batch norm is synchronized.

    Example:
        >>> import keras, strategykit as sk
        >>> model = keras.Sequential([keras.Input((3,)), keras.layers.BatchNormalization(
        ...     name="bn"), sk.SyncBatchNormalization(name="sync_bn")])
        >>> unsynchronized_batch_norms(model)
        ['bn']
    """
    names = []
    for layer in model.layers:
        if isinstance(layer, keras.Model):
            names += unsynchronized_batch_norms(layer, f"{prefix}{layer.name}/")
        elif (isinstance(layer, keras.layers.BatchNormalization)
              and not isinstance(layer, SyncBatchNormalization) and not layer.synchronized):
            names.append(f"{prefix}{layer.name}")
    return names
