"""The one interface of every environment a job's workers can come from.

An environment is what starts the workers and tells each who it is: `TF_CONFIG` (written
by `strategykit launch`, Ray Train, Vertex AI, SageMaker, Azure ML or by hand), a SLURM
job step, a Kubernetes Indexed Job or JobSet, or none (one machine). Each is one small
module of this package with one class, like Lightning's `plugins/environments/` (SLURM's
node handling has a module of its own, `slurm_nodes`); the class answers three
questions: is this process in it (`detected`), who is this worker (`task`), and how
TensorFlow reaches the others (`resolver`). Every count of a job's workers and every
worker's index in the job is made here, by `count_workers` and `worker_position`,
whatever the cluster comes from (an environment, or a strategy's cluster resolver).

Example:
    >>> cluster = {"chief": ["c:2222"], "worker": ["w0:2222", "w1:2222"]}
    >>> count_workers(cluster), worker_position(Task("worker", 1, cluster))
    (3, 2)
"""

from __future__ import annotations

import abc
import os
from collections.abc import Mapping, Sequence
from typing import ClassVar, NamedTuple

import tensorflow as tf

TRAINING_TASK_TYPES = ("chief", "worker")
"""The task types of a cluster that train together under MultiWorkerMirroredStrategy."""


class Task(NamedTuple):
    """Who this worker is: its task type and index, and the whole cluster.

    Attributes:
        type: `"chief"` or `"worker"`, as in `TF_CONFIG`.
        index: its index among the tasks of that type.
        cluster: task type -> addresses (`host:port`), as in `TF_CONFIG`; an address may
            be None where the environment knows how many workers there are but not
            their addresses without more work (SLURM's node list, expanded only when the
            cluster is built).
    """

    type: str
    index: int
    cluster: dict


class Environment(abc.ABC):
    """An environment that starts a job's workers. Subclasses read `environ` only.

    Args:
        environ: the process environment to read; default `os.environ`.
    """

    name: ClassVar[str]
    """What `strategykit info` calls it."""

    def __init__(self, environ: Mapping[str, str] | None = None):
        self.environ = os.environ if environ is None else environ

    @abc.abstractmethod
    def detected(self) -> bool:
        """Whether this process is a worker started by this environment."""

    @abc.abstractmethod
    def task(self) -> Task:
        """This worker's task and the cluster.

        Raises:
            ValueError: the environment's variables are malformed or incomplete; the
                message names the variable, what was received and the fix.
        """

    def describe(self) -> str:
        """The environment's name, as `strategykit info` shows it."""
        return self.name

    def workers(self) -> int:
        """The number of workers (chief included) that train together (`count_workers`)."""
        return count_workers(self.task().cluster)

    def worker_index(self) -> int:
        """This worker's position in the job (`worker_position`): 0 for the chief."""
        return worker_position(self.task())

    def resolver(self) -> tf.distribute.cluster_resolver.ClusterResolver:
        """The cluster for `tf.distribute.MultiWorkerMirroredStrategy`."""
        task = self.task()
        return tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec(task.cluster), task_type=task.type, task_id=task.index,
            rpc_layer="grpc")


def count_workers(cluster: Mapping[str, Sequence]) -> int:
    """The workers (chief included) that train together in `cluster`; 1 for an empty one.

    Args:
        cluster: task type -> addresses, as in `TF_CONFIG` or a cluster resolver's
            `cluster_spec().as_dict()`; task types other than `TRAINING_TASK_TYPES`
            (an `evaluator`, `ps`) are not counted.
    """
    return max(1, sum(len(cluster.get(kind) or ()) for kind in TRAINING_TASK_TYPES))


def worker_position(task: Task) -> int:
    """A worker's index in the job: 0 for the chief, then the workers in order.

    Args:
        task: the worker's task; `Task("worker", 0, {})` for one worker alone.

    Returns:
        0 for the chief (the task of type `"chief"`, otherwise worker 0), else its
        index among every worker of the job.
    """
    if task.type == "chief":
        return 0
    return len(task.cluster.get("chief") or ()) + task.index
