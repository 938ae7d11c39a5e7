"""Where a job's workers come from: one small module per environment, one interface.

`detect()` returns the first environment this process is in, in this order:
`TF_CONFIG` (written by `strategykit launch`, Ray Train, Vertex AI, SageMaker, Azure ML
or by hand; it always wins), a SLURM job step of several tasks, a Kubernetes JobSet, a
Kubernetes Indexed Job, else one machine. Each answers the same questions
(`base.Environment`): who is this worker, how many are there (`count_workers`), which
is it in the job (`worker_position`), how TensorFlow reaches them. `sk.from_env()`
builds its strategy from it; `sk.is_chief()` and `strategykit.cluster.roles.worker_index()`
read it; `strategykit info` names it.

Besides one module per environment (`tf_config`, `slurm`, `kubernetes_job`, `jobset`,
`one_machine`): `base` (the interface, and the counting of workers), `port`
(`STRATEGYKIT_PORT`, which SLURM and Kubernetes share) and `slurm_nodes` (a SLURM
step's nodes, for `slurm`).

Example:
    >>> detect({}).describe()  # no TF_CONFIG, no srun, no Kubernetes Job
    'one machine'
"""

from __future__ import annotations

from collections.abc import Mapping

from strategykit.cluster.environments.base import (
    Environment,
    Task,
    count_workers,
    worker_position,
)
from strategykit.cluster.environments.jobset import JobSet
from strategykit.cluster.environments.kubernetes_job import KubernetesIndexedJob
from strategykit.cluster.environments.one_machine import OneMachine
from strategykit.cluster.environments.slurm import Slurm
from strategykit.cluster.environments.tf_config import TFConfig

ENVIRONMENTS: tuple[type[Environment], ...] = (TFConfig, Slurm, JobSet, KubernetesIndexedJob)
"""The environments `detect` tries, in order, before one machine."""

__all__ = [
    "ENVIRONMENTS", "Environment", "JobSet", "KubernetesIndexedJob", "OneMachine", "Slurm",
    "TFConfig", "Task", "count_workers", "detect", "worker_position",
]


def detect(environ: Mapping[str, str] | None = None) -> Environment:
    """The environment this process is a worker of; `OneMachine` when none.

    Args:
        environ: the process environment to read; default `os.environ`.
    """
    for kind in ENVIRONMENTS:
        environment = kind(environ)
        if environment.detected():
            return environment
    return OneMachine(environ)
