"""What each backup of `sk.callbacks.BackupAndRestore` records besides Keras's files.

`strategykit.json` in a backup holds the replicas and worker processes that wrote it
(so a resume on another number can say when it cannot be exact) and the steps of the
interrupted epoch it holds (0 at an epoch's end; a resume goes on at the next step).
`accumulation.npz`, in a backup of gradient accumulation on several replicas, holds the
window in progress: each replica accumulates its own gradients until the window's
update, and Keras's checkpoint keeps replica 0's only (`write_window`, `resume_window`).
"""

from __future__ import annotations

import json
import os

import numpy as np
import tensorflow as tf

from strategykit.cluster.roles import is_multi_worker
from strategykit.upstream import accumulation

RECORD = "strategykit.json"
WINDOW = "accumulation.npz"


def record_of(strategy: tf.distribute.Strategy) -> dict:
    """The replicas and worker processes of `strategy`, as a backup records them.

    Example:
        >>> import strategykit as sk
        >>> record_of(sk.mirrored(replicas=2))  # doctest: +SKIP
        {'replicas': 2, 'workers': 1}
    """
    replicas = strategy.num_replicas_in_sync
    local = len(strategy.extended.worker_devices) if is_multi_worker(strategy) else replicas
    return {"replicas": replicas, "workers": replicas // max(local, 1)}


def write_record(backup: str, record: dict) -> None:
    """Writes `record` into the backup folder `backup`."""
    with open(os.path.join(backup, RECORD), "w") as file:
        json.dump(record, file)


def read_record(backup: str) -> dict:
    """What a backup records; {} for a backup written before backups recorded it."""
    try:
        with open(os.path.join(backup, RECORD)) as file:
            return json.load(file)
    except FileNotFoundError:
        return {}


def replicas_text(record: dict) -> str:
    """E.g. "4 replicas on 2 workers", for messages.

    Example:
        >>> replicas_text({"replicas": 4, "workers": 2})
        '4 replicas on 2 workers'
    """
    replicas, workers = record["replicas"], record["workers"]
    text = f"{replicas} replica{'s' * (replicas != 1)}"
    return text + (f" on {workers} workers" if workers > 1 else "")


def window_of(model) -> list[np.ndarray] | None:
    """The gradient-accumulation window in progress of `model`'s optimizer, summed over
    the replicas; None where Keras's checkpoint holds it whole. Every worker calls it."""
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None or not optimizer.built:
        return None
    return accumulation.window_sums(optimizer, model.distribute_strategy)


def write_window(backup: str, window: list[np.ndarray] | None) -> None:
    """Writes `window_of(model)` into the backup folder `backup` (nothing for None)."""
    if window is not None:
        np.savez(os.path.join(backup, WINDOW), *window)


def resume_window(backup: str, model) -> None:
    """Gives `model`'s accumulators the window in progress that `backup` holds, if any,
    after Keras's restore, on any number of replicas.

    Raises:
        ValueError: the backup holds a window and the optimizer accumulates no gradients.
    """
    path = os.path.join(backup, WINDOW)
    if not os.path.exists(path):
        return
    optimizer = model.optimizer
    if not optimizer.gradient_accumulation_steps:
        raise ValueError(
            f"The backup {backup} holds gradients accumulated in an update window that "
            "had not ended, and this model's optimizer accumulates none. Received: "
            f"gradient_accumulation_steps={optimizer.gradient_accumulation_steps!r}. "
            "Compile with the gradient_accumulation_steps of the run that wrote it.")
    with np.load(path) as saved:
        window = [saved[f"arr_{index}"] for index in range(len(saved.files))]
    accumulation.resume_window(optimizer, model.distribute_strategy, window)
