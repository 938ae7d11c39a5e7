"""A SLURM job step of several tasks (`srun -n 4 python train.py`): one worker a task.

The reading of SLURM's variables and the cluster TensorFlow builds from them are in
`strategykit.cluster.slurm`; this class puts them behind the common interface.
"""

from __future__ import annotations

import tensorflow as tf

from strategykit.cluster import slurm
from strategykit.cluster.environments.base import Environment, Task


class Slurm(Environment):
    """The tasks of the SLURM job step this process is one of (`os.environ` only).

    Task `SLURM_PROCID` is this worker, task 0 the chief. The workers' addresses need the
    step's node list expanded, which `resolver` does; `task` gives their number only.

    Example:
        >>> Slurm().detected()  # not under srun
        False
    """

    name = "SLURM"

    def detected(self) -> bool:
        return slurm.slurm_tasks() > 1

    def task(self) -> Task:
        return Task("worker", slurm.slurm_task_index(), {"worker": [None] * slurm.slurm_tasks()})

    def resolver(self) -> tf.distribute.cluster_resolver.ClusterResolver:
        return slurm.slurm_resolver()
