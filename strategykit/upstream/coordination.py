"""The key-value store of TensorFlow's coordination service, for every worker of a job.

`MultiWorkerMirroredStrategy` runs a coordination service on the chief; every worker can
set a key once and wait for a key another worker sets. TensorFlow's own preemption
handler (`tf.distribute.experimental.PreemptionCheckpointHandler`) agrees on a step
through it, but that handler saves `tf.train.Checkpoint`s, supports one handler per
program and does nothing on GCP CPU machines, so `sk.callbacks.BackupAndRestore` runs
the same agreement itself (`strategykit.callbacks.preemption`). The store has no public
API: these two functions call the eager context's methods, a `PinnedAccess` (pinned
on TensorFlow 2.18.1, 2.20.0 and 2.21.0; on unknown code they refuse).
"""

from __future__ import annotations

import tensorflow as tf
from tensorflow.python.eager import context

from strategykit.pinning.pinned_access import PinnedAccess

COORDINATION = PinnedAccess(
    issue="tensorflow/tensorflow (unreported)",
    affects="BackupAndRestore's agreement on a preemption step across workers",
    relies_on={"tensorflow.python.eager.context:Context.set_config_key_value":
                   "b3c27a62ad85bd20",
               "tensorflow.python.eager.context:Context.get_config_key_value":
                   "4d8db85cf91ec3ef"},
    refuses=True)
PINNED = (COORDINATION,)


def set_key(key: str, value: str) -> bool:
    """Sets `key` for the whole job, once.

    Returns:
        True, or False when a worker has set it already.

    Raises:
        UnknownUpstreamCode: where TensorFlow's code is not the code pinned.
    """
    COORDINATION.require()
    try:
        context.context().set_config_key_value(key, value)
    except tf.errors.AlreadyExistsError:
        return False
    return True


def wait_for_key(key: str) -> str:
    """The value of `key`, waiting until some worker sets it.

    Raises:
        UnknownUpstreamCode: where TensorFlow's code is not the code pinned.
    """
    COORDINATION.require()
    return context.context().get_config_key_value(key)
