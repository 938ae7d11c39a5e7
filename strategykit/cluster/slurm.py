"""Worker processes started by SLURM: `slurm_tasks()`, `slurm_task_index()`, `slurm_resolver()`.

Under `srun -n 4 python train.py` every task of the job step is one worker of a
`tf.distribute.MultiWorkerMirroredStrategy`; `sk.from_env()` builds it (when `TF_CONFIG`
is not set) with TensorFlow's `tf.distribute.cluster_resolver.SlurmClusterResolver`.
That resolver (checked on TensorFlow 2.21) reads `SLURM_PROCID`, `SLURM_STEP_NUM_TASKS`,
`SLURM_STEP_NODELIST` and `SLURM_STEP_TASKS_PER_NODE`, expands the node list itself in
Python, orders the nodes by name, and gives the tasks of one node consecutive ports from
a base port (8888). Here the node list is expanded by Slurm's own `scontrol show
hostnames` when `scontrol` is on PATH; the base port is `STRATEGYKIT_PORT` when set.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import tensorflow as tf

PORT_VARIABLE = "STRATEGYKIT_PORT"
"""The environment variable that sets the first port of the tasks on a node."""

DEFAULT_PORT = 8888
"""The first port without `STRATEGYKIT_PORT`: SlurmClusterResolver's `port_base`."""

_SlurmClusterResolver = tf.distribute.cluster_resolver.SlurmClusterResolver


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
        >>> import strategykit.cluster.slurm
        >>> strategykit.cluster.slurm.slurm_tasks()  # not under srun
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
        >>> import strategykit.cluster.slurm
        >>> strategykit.cluster.slurm.slurm_task_index()  # not under srun
        0
    """
    return int(os.environ["SLURM_PROCID"]) if slurm_tasks() > 1 else 0


def slurm_resolver(port: int | None = None) -> _SlurmClusterResolver:
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
        >>> import strategykit.cluster.slurm, tensorflow as tf
        >>> resolver = strategykit.cluster.slurm.slurm_resolver()  # doctest: +SKIP
        >>> strategy = tf.distribute.MultiWorkerMirroredStrategy(  # doctest: +SKIP
        ...     cluster_resolver=resolver)
    """
    tasks, rank = _step_integers()
    nodelist = _step_variable("SLURM_STEP_NODELIST")
    counts = _tasks_on_each_node(_step_variable("SLURM_STEP_TASKS_PER_NODE"), tasks)
    hosts = _expand_nodelist(nodelist)
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
    gpus = _gpus_on_node()
    if gpus == 0:
        resolver_class = _CpuSlurmClusterResolver
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
        resolver_class = _SlurmClusterResolver
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
    _check_own_node(resolver, rank)
    return resolver


class _CpuSlurmClusterResolver(_SlurmClusterResolver):
    """SlurmClusterResolver for nodes without GPUs: each task is one CPU worker.

    TensorFlow's resolver cannot describe a node without GPUs (checked on 2.21): it
    counts them with `nvidia-smi` (FileNotFoundError where it is not installed), and
    with 0 GPUs its `cluster_spec()` fails with `range() arg 3 must not be zero`, as it
    steps through the node's GPUs by GPUs per task. So this one is built with a
    placeholder GPU per task that is never assigned (`auto_set_gpu=False`) and reports
    no accelerators, which makes MultiWorkerMirroredStrategy use the CPU.
    tests/test_slurm.py fails when upstream handles 0 GPUs and this class can go.
    """

    def num_accelerators(self, task_type=None, task_id=None, config_proto=None):
        del task_type, task_id, config_proto
        return {"GPU": 0}


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


def _tasks_on_each_node(raw: str, tasks: int) -> list[int]:
    """`"2(x3),1"` -> `[2, 2, 2, 1]`, SLURM's tasks per node, in node list order."""
    counts = []
    for part in raw.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if match is None:
            counts = []
            break
        counts += [int(match[1])] * int(match[2] or 1)
    if not counts or sum(counts) != tasks or min(counts) < 1:
        raise ValueError(
            f"SLURM_STEP_TASKS_PER_NODE does not describe the step's {tasks} task(s). "
            f"Received: SLURM_STEP_TASKS_PER_NODE={raw!r}, SLURM_STEP_NUM_TASKS={tasks}. "
            "Start the workers with srun, which sets both (e.g. '2(x3),1')."
        )
    return counts


def _expand_nodelist(nodelist: str) -> list[str] | None:
    """The node names, by `scontrol show hostnames`; None when scontrol is not on PATH."""
    scontrol = shutil.which("scontrol")
    if scontrol is None:
        return None
    result = subprocess.run(
        [scontrol, "show", "hostnames", nodelist], capture_output=True, text=True, timeout=60
    )
    hosts = result.stdout.split()
    if result.returncode != 0 or not hosts:
        raise RuntimeError(
            f"`scontrol show hostnames` could not expand the SLURM node list (exit code "
            f"{result.returncode}: {result.stderr.strip()!r}). Received: "
            f"SLURM_STEP_NODELIST={nodelist!r}, scontrol={scontrol!r}. Check that this "
            "scontrol belongs to the Slurm that started the job."
        )
    return hosts


def _first_port(port, tasks_on_a_node: int) -> int:
    source = f"port={port!r}"
    if port is None:
        raw = os.environ.get(PORT_VARIABLE, "").strip()
        if not raw:
            return DEFAULT_PORT
        source = f"{PORT_VARIABLE}={raw!r}"
        port = int(raw) if raw.isdigit() else None
    highest = 65536 - tasks_on_a_node
    if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= highest:
        raise ValueError(
            f"The first port of the SLURM tasks must be an integer from 1 to {highest} "
            f"(the {tasks_on_a_node} task(s) on a node use it and the ports after it). "
            f"Received: {source}. Use e.g. {PORT_VARIABLE}=23456, a port that no other "
            "job on the node uses."
        )
    return port


def _gpus_on_node() -> int:
    """The node's GPUs as SlurmClusterResolver counts them, but 0 where it would fail.

    Upstream counts the entries of `CUDA_VISIBLE_DEVICES` (an empty value, which hides
    every GPU, counts 1 there), else the `GPU ` lines of `nvidia-smi --list-gpus`
    (raising where nvidia-smi is missing or fails: a node without GPUs or driver).
    """
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        ids = [item.strip() for item in visible.split(",") if item.strip()]
        return 0 if not ids or ids[0].startswith("-") else len(ids)
    nvidia_smi = shutil.which("nvidia-smi")
    if nvidia_smi is None:
        return 0
    result = subprocess.run(
        [nvidia_smi, "--list-gpus"], capture_output=True, text=True, timeout=60
    )
    if result.returncode != 0:
        return 0
    return sum(line.startswith("GPU ") for line in result.stdout.splitlines())


def _check_own_node(resolver, rank: int) -> None:
    """Fails when TensorFlow's resolver puts this task on a node SLURM did not.

    The resolver orders the nodes by name as text (`n10` before `n9`) and assumes tasks
    fill the nodes in that order (srun's default block distribution); otherwise each
    task would serve another task's address and the job would hang.
    """
    node = os.environ.get("SLURMD_NODENAME", "").strip()
    if not node:
        return
    address = resolver.cluster_spec().task_address("worker", rank)
    host = address.rsplit(":", 1)[0]
    if host != node:
        raise RuntimeError(
            f"SlurmClusterResolver places SLURM task {rank} on node {host!r}, but SLURM "
            f"started it on {node!r}: it orders nodes by name as text and expects tasks to "
            f"fill the nodes in that order. Received: SLURMD_NODENAME={node!r}, "
            f"SLURM_STEP_NODELIST={os.environ.get('SLURM_STEP_NODELIST')!r}. Use srun's "
            "default block distribution and node names that sort as text, or set "
            "TF_CONFIG for each task instead."
        )
