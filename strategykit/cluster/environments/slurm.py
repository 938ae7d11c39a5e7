"""A SLURM job step of several tasks (`srun -n 4 python train.py`): one worker a task.

Under `srun` every task of the job step is one worker of a
`tf.distribute.MultiWorkerMirroredStrategy`; `sk.from_env()` builds it (when `TF_CONFIG`
is not set) with TensorFlow's `tf.distribute.cluster_resolver.SlurmClusterResolver`.
That resolver (checked on TensorFlow 2.21) reads `SLURM_PROCID`, `SLURM_STEP_NUM_TASKS`,
`SLURM_STEP_NODELIST` and `SLURM_STEP_TASKS_PER_NODE`, expands the node list itself in
Python, orders the nodes by name, and gives the tasks of one node consecutive ports from
a base port (8888). Here the node list is expanded by Slurm's own `scontrol show
hostnames` when `scontrol` is on PATH (`slurm_nodes`), and the base port is
`STRATEGYKIT_PORT` when set (`port`). This module holds the environment (`Slurm`) and
the reading of the step's variables: `slurm_tasks()`, `slurm_task_index()`,
`slurm_resolver()`.
"""

from __future__ import annotations

import os

import tensorflow as tf

from strategykit.cluster.environments.base import Environment, Task
from strategykit.cluster.environments.port import PORT_VARIABLE, read_port
from strategykit.cluster.environments.slurm_nodes import (
    CpuSlurmClusterResolver,
    SlurmClusterResolver,
    check_own_node,
    expand_nodelist,
    gpus_on_node,
    tasks_on_each_node,
)


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
        return slurm_tasks() > 1

    def task(self) -> Task:
        return Task("worker", slurm_task_index(), {"worker": [None] * slurm_tasks()})

    def resolver(self) -> tf.distribute.cluster_resolver.ClusterResolver:
        return slurm_resolver()


def slurm_tasks() -> int:
    """The number of tasks of the SLURM job step this process is one of.

    `srun` sets `SLURM_PROCID` (this task) and `SLURM_STEP_NUM_TASKS` (the step's tasks)
    in every task it starts. A batch script (`sbatch -n 4 job.sh`) runs once, with the
    allocation's `SLURM_NTASKS=4` but no step of its own: it is one process, so this is
    1 there (counting `SLURM_NTASKS` would make it wait forever for 3 workers).

    Returns:
        `SLURM_STEP_NUM_TASKS` inside a task started by `srun`; 1 outside SLURM.

    Raises:
        ValueError: `SLURM_STEP_NUM_TASKS` or `SLURM_PROCID` is not a valid number.

    Example:
        >>> from strategykit.cluster.environments.slurm import slurm_tasks
        >>> slurm_tasks()  # not under srun
        1
    """
    procid = os.environ.get("SLURM_PROCID", "").strip()
    raw = os.environ.get("SLURM_STEP_NUM_TASKS", "").strip()
    if not procid or not raw:
        return 1
    tasks = _integer("SLURM_STEP_NUM_TASKS", raw, minimum=1)
    index = _integer("SLURM_PROCID", procid, minimum=0)
    if index >= tasks:
        raise ValueError(
            f"SLURM_PROCID is not a task of this step. Received: SLURM_PROCID={procid!r}, "
            f"SLURM_STEP_NUM_TASKS={raw!r}. Start the workers with srun, which sets both."
        )
    return tasks


def slurm_task_index() -> int:
    """This task's index in its SLURM job step (`SLURM_PROCID`); 0 outside SLURM.

    Task 0 is the chief, the worker that writes the files.

    Example:
        >>> from strategykit.cluster.environments.slurm import slurm_task_index
        >>> slurm_task_index()  # not under srun
        0
    """
    return int(os.environ["SLURM_PROCID"]) if slurm_tasks() > 1 else 0


def slurm_resolver(port: int | None = None) -> SlurmClusterResolver:
    """The cluster of the SLURM job step this task is in, for MultiWorkerMirroredStrategy.

    Every task of the step is a `"worker"`, task `SLURM_PROCID` is this one. The tasks
    on one node listen on consecutive ports: `port`, `port + 1`, ... Nodes with GPUs are
    left to TensorFlow's resolver, which gives each task of a node its own GPUs by
    setting `CUDA_VISIBLE_DEVICES` when the cluster is resolved (before TensorFlow's
    runtime starts, so build the strategy first in the script). On nodes without GPUs
    each task is one CPU worker.

    Args:
        port: the first port of the tasks on each node. Default None: the environment
            variable `STRATEGYKIT_PORT`, else 8888 (TensorFlow's default). Two jobs
            sharing a node need different ports.

    Returns:
        A `tf.distribute.cluster_resolver.SlurmClusterResolver`; pass it as
        `MultiWorkerMirroredStrategy(cluster_resolver=...)`, as `sk.from_env()` does.

    Raises:
        ValueError: a SLURM variable is missing or malformed, a bad port, or more tasks
            on a node than it has GPUs.
        RuntimeError: the node list cannot be expanded (`scontrol` is missing or fails),
            or SLURM placed this task on another node than TensorFlow's resolver thinks.

    Example:
        >>> import tensorflow as tf
        >>> from strategykit.cluster.environments.slurm import slurm_resolver
        >>> resolver = slurm_resolver()  # doctest: +SKIP
        >>> strategy = tf.distribute.MultiWorkerMirroredStrategy(  # doctest: +SKIP
        ...     cluster_resolver=resolver)
    """
    tasks, rank = _step_integers()
    nodelist = _step_variable("SLURM_STEP_NODELIST")
    counts = tasks_on_each_node(_step_variable("SLURM_STEP_TASKS_PER_NODE"), tasks)
    hosts = expand_nodelist(nodelist)
    kwargs = {"port_base": _first_port(port, max(counts))}
    if hosts is not None:  # else TensorFlow expands SLURM_STEP_NODELIST itself
        if len(hosts) != len(counts):
            raise ValueError(
                f"SLURM's node list and tasks per node do not match: {len(hosts)} node(s), "
                f"{len(counts)} count(s). Received: SLURM_STEP_NODELIST={nodelist!r}, "
                f"SLURM_STEP_TASKS_PER_NODE={os.environ['SLURM_STEP_TASKS_PER_NODE']!r}. "
                "Start the workers with srun, which sets both."
            )
        kwargs["tasks_per_node"] = dict(zip(hosts, counts))
    gpus = gpus_on_node()
    if gpus == 0:
        resolver_class = CpuSlurmClusterResolver
        kwargs.update(gpus_per_node=tasks, gpus_per_task=1, auto_set_gpu=False)
    elif gpus < max(counts):
        raise ValueError(
            f"SLURM runs {max(counts)} tasks on a node with {gpus} visible GPU(s); "
            f"SlurmClusterResolver gives every task whole GPUs of its node. Received: "
            f"SLURM_STEP_TASKS_PER_NODE={os.environ['SLURM_STEP_TASKS_PER_NODE']!r}, "
            f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}. Use at most "
            "one task per GPU, or one task per node (it mirrors over the node's GPUs)."
        )
    else:
        resolver_class = SlurmClusterResolver
        kwargs["gpus_per_node"] = gpus
    try:
        resolver = resolver_class(**kwargs)
    except ValueError as error:
        if hosts is not None:
            raise
        # Without scontrol TensorFlow expands the node list with its own parser, which
        # rejects valid Slurm node lists such as 'n[1-2]-ib' (text after a range).
        raise RuntimeError(
            f"The SLURM node list cannot be expanded without Slurm's `scontrol`, which is "
            f"not on PATH ({error}). Received: SLURM_STEP_NODELIST={nodelist!r}. Put "
            "Slurm's bin directory on PATH (inside a container: make `scontrol` visible), "
            "or set TF_CONFIG for each task instead."
        ) from error
    check_own_node(resolver, rank)
    return resolver


def _integer(name: str, raw: str, *, minimum: int) -> int:
    if not raw.isdigit() or int(raw) < minimum:
        raise ValueError(
            f"{name} must be an integer of at least {minimum}. Received: {name}={raw!r}. "
            "Start the workers with srun, which sets it."
        )
    return int(raw)


def _step_variable(name: str) -> str:
    value = os.environ.get(name, "").strip()
    if not value:
        raise ValueError(
            f"{name} is not set: this process is not a task of a SLURM job step. Received: "
            f"{name}={os.environ.get(name)!r}. Start the workers with srun, e.g. "
            "`srun -N 2 --ntasks-per-node=1 python train.py`."
        )
    return value


def _step_integers() -> tuple[int, int]:
    """(tasks of the step, this task's index), both required and checked."""
    _step_variable("SLURM_STEP_NUM_TASKS")
    rank = _step_variable("SLURM_PROCID")
    return slurm_tasks(), int(rank)  # slurm_tasks() checks both


def _first_port(port: int | None, tasks_on_a_node: int) -> int:
    """The port of each node's first task; the node's other tasks use the ports after it."""
    return read_port(
        os.environ, port=port, span=tasks_on_a_node, what="The first port of the SLURM tasks",
        span_note=f"the {tasks_on_a_node} task(s) on a node use it and the ports after it",
        fix=f"Use e.g. {PORT_VARIABLE}=23456, a port that no other job on the node uses.")
