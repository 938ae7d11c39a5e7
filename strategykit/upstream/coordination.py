"""The key-value store of TensorFlow's coordination service, for every worker of a job.

`MultiWorkerMirroredStrategy` runs a coordination service on the chief; every worker can
set a key once and wait for a key another worker sets. TensorFlow's own preemption
handler (`tf.distribute.experimental.PreemptionCheckpointHandler`) agrees on a step
through it, but that handler saves `tf.train.Checkpoint`s, supports one handler per
program and does nothing on GCP CPU machines, so `sk.callbacks.BackupAndRestore` runs
the same agreement itself (`strategykit.callbacks.preemption`). The store has no public
API: these two functions call the eager context's methods, pinned by fingerprint
(tests/upstream/test_upstream.py). Checked on TensorFlow 2.21.0.
"""

from __future__ import annotations

import tensorflow as tf
from tensorflow.python.eager import context

COORDINATION_RELIES_ON = {
    "tensorflow.python.eager.context:Context.set_config_key_value": "b3c27a62ad85bd20",
    "tensorflow.python.eager.context:Context.get_config_key_value": "4d8db85cf91ec3ef",
}


def set_key(key: str, value: str) -> bool:
    """Sets `key` for the whole job, once.

    Returns:
        True, or False when a worker has set it already.
    """
    try:
        context.context().set_config_key_value(key, value)
    except tf.errors.AlreadyExistsError:
        return False
    return True


def wait_for_key(key: str) -> str:
    """The value of `key`, waiting until some worker sets it."""
    return context.context().get_config_key_value(key)
