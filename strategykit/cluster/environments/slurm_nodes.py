"""The nodes of a SLURM job step, as TensorFlow's `SlurmClusterResolver` needs them.

`environments.slurm.slurm_resolver()` builds the resolver from these: the step's tasks on
each node (`SLURM_STEP_TASKS_PER_NODE`), its node list expanded by Slurm's own `scontrol
show hostnames` (TensorFlow's parser rejects valid lists such as `n[1-2]-ib`), the node's
GPUs, a resolver for nodes without GPUs (`CpuSlurmClusterResolver`), and the check that
the resolver puts this task on the node SLURM started it on.

Example:
    >>> tasks_on_each_node("2(x3),1", tasks=7)
    [2, 2, 2, 1]
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import tensorflow as tf

SlurmClusterResolver = tf.distribute.cluster_resolver.SlurmClusterResolver
"""TensorFlow's resolver of a SLURM job step's cluster."""


class CpuSlurmClusterResolver(SlurmClusterResolver):
    """SlurmClusterResolver for nodes without GPUs: each task is one CPU worker.

    TensorFlow's resolver cannot describe a node without GPUs (checked on 2.21): it
    counts them with `nvidia-smi` (FileNotFoundError where it is not installed), and
    with 0 GPUs its `cluster_spec()` fails with `range() arg 3 must not be zero`, as it
    steps through the node's GPUs by GPUs per task. So this one is built with a
    placeholder GPU per task that is never assigned (`auto_set_gpu=False`) and reports
    no accelerators, which makes MultiWorkerMirroredStrategy use the CPU.
    tests/cluster/test_slurm.py fails when upstream handles 0 GPUs and this class can go.
    """

    def num_accelerators(self, task_type=None, task_id=None, config_proto=None):
        del task_type, task_id, config_proto
        return {"GPU": 0}


def tasks_on_each_node(raw: str, tasks: int) -> list[int]:
    """`"2(x3),1"` -> `[2, 2, 2, 1]`, SLURM's tasks per node, in node list order.

    Raises:
        ValueError: `raw` is malformed or does not add up to `tasks`.
    """
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


def expand_nodelist(nodelist: str) -> list[str] | None:
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


def gpus_on_node() -> int:
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


def check_own_node(resolver, rank: int) -> None:
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
