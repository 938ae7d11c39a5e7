"""What each backup of `sk.callbacks.BackupAndRestore` records besides Keras's files.

`strategykit.json` in a backup holds the replicas and worker processes that wrote it
(so a resume on another number can say when it cannot be exact) and the steps of the
interrupted epoch it holds (0 at an epoch's end; a resume goes on at the next step).
"""

from __future__ import annotations

import json
import os

import tensorflow as tf

from strategykit.cluster.roles import is_multi_worker

RECORD = "strategykit.json"


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
