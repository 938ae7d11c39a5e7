"""The right `tf.distribute` strategy in one call: `mirrored()` and `from_env()`."""

from __future__ import annotations

import itertools
import json
import os

import tensorflow as tf

from strategykit import devices as _devices
from strategykit import upstream

CROSS_DEVICE_OPS = ("auto", "nccl", "hierarchical_copy", "reduce_to_one_device")
"""The valid string values of `cross_device_ops`."""

# TensorFlow starts the collective group keys of every MirroredStrategy at 1. Two
# strategies over different device sets in one process (a notebook cell re-run with
# another replica count, a test suite) then join the same group with different sizes
# and fail with "Device CPU:0 is joining a group with size 4, but that group has size
# 2". MirroredStrategy reads its key base from the attribute `_collective_key_base` of
# the strategy object when it is built; giving each strategy its own range of keys makes
# them independent. This is the one place strategykit relies on a private TensorFlow
# attribute; tests/test_strategy.py fails if upstream changes it.
_COLLECTIVE_KEYS_PER_STRATEGY = 100_000
_strategies_built = itertools.count(1)


def mirrored(
    devices: list[str] | None = None,
    *,
    replicas: int | None = None,
    cross_device_ops: str | tf.distribute.CrossDeviceOps = "auto",
) -> tf.distribute.MirroredStrategy:
    """Builds a `tf.distribute.MirroredStrategy` for this machine.

    Without arguments it uses every local GPU, or the CPU when there is none. With
    `replicas=N` it gives N replicas whatever the hardware: the first N GPUs when there
    are that many, otherwise logical devices made by splitting the CPU (no GPU) or the
    GPUs (virtual GPUs of `devices.DEFAULT_VIRTUAL_GPU_MEMORY_MB` each). Splitting is
    only possible before TensorFlow's runtime starts, so call it first in a process.

    Strategies built here are independent of each other: building a 2-replica and then
    a 4-replica strategy in one process (a re-run notebook cell) works. Building one
    installs strategykit's fixes of upstream gaps (`strategykit/upstream.py`; e.g.
    Keras's `gradient_accumulation_steps` under a strategy), as `from_env()` does.

    Args:
        devices: device names such as `["/gpu:0", "/gpu:1"]`. Default: as described
            above. Cannot be combined with `replicas`.
        replicas: number of replicas, at least 1. Default: every GPU, or 1 CPU.
        cross_device_ops: how gradients are all-reduced: `"auto"` (default; NCCL on
            GPUs, TensorFlow's collective ring on CPUs), `"nccl"` (GPUs only),
            `"hierarchical_copy"`, `"reduce_to_one_device"`, or a
            `tf.distribute.CrossDeviceOps` instance.

    Returns:
        A `tf.distribute.MirroredStrategy`.

    Raises:
        ValueError: an invalid `replicas` or `cross_device_ops`, both `devices` and
            `replicas`, or `"nccl"` on a machine without GPUs.
        RuntimeError: TensorFlow has already started with too few devices for `replicas`.

    Example:
        >>> import strategykit as sk
        >>> strategy = sk.mirrored(replicas=2)  # doctest: +SKIP
        >>> strategy.num_replicas_in_sync  # doctest: +SKIP
        2
    """
    if devices is not None and replicas is not None:
        raise ValueError(
            f"Pass either devices or replicas, not both. Received: devices={devices!r}, "
            f"replicas={replicas!r}. Use devices=[...] to name them, or replicas=N to get N."
        )
    if replicas is not None:
        _check_replicas(replicas)
    ops = _cross_device_ops(cross_device_ops)
    if devices is None:
        devices = _default_devices(replicas)
    elif isinstance(devices, str) or not devices:
        raise ValueError(
            f"devices must be a non-empty list of device names. Received: devices="
            f"{devices!r}. Use e.g. devices=['/gpu:0', '/gpu:1']."
        )
    return _build_mirrored(list(devices), ops)


def from_env(*, cross_device_ops: str | tf.distribute.CrossDeviceOps = "auto"):
    """Builds the strategy the environment asks for.

    When `TF_CONFIG` names a cluster of more than one worker, this process is one worker
    of a `tf.distribute.MultiWorkerMirroredStrategy`; otherwise it is `mirrored()`.

    Args:
        cross_device_ops: `"auto"` (default) or `"nccl"` across workers; on a single
            machine any value `mirrored()` takes.

    Returns:
        A `tf.distribute.MultiWorkerMirroredStrategy` or a `tf.distribute.MirroredStrategy`.

    Raises:
        ValueError: `TF_CONFIG` is malformed; the message names the bad field.

    Example:
        >>> import os, json, strategykit as sk
        >>> os.environ["TF_CONFIG"] = json.dumps({
        ...     "cluster": {"worker": ["host1:12345", "host2:12345"]},
        ...     "task": {"type": "worker", "index": 0}})
        >>> strategy = sk.from_env()  # doctest: +SKIP
    """
    config = read_tf_config()
    if count_workers(config) <= 1:
        return mirrored(cross_device_ops=cross_device_ops)
    upstream.install()
    return tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=_multi_worker_options(cross_device_ops)
    )


def read_tf_config(raw: str | None = None) -> dict:
    """Reads and checks `TF_CONFIG` (or `raw`); `{}` when it is unset or empty.

    Raises:
        ValueError: bad JSON, no `cluster` or `task`, a task type not in the cluster, or
            a task index out of range.
    """
    raw = os.environ.get("TF_CONFIG", "") if raw is None else raw
    if not raw.strip():
        return {}
    try:
        config = json.loads(raw)
    except json.JSONDecodeError as error:
        raise ValueError(
            f"TF_CONFIG is not valid JSON ({error.msg} at character {error.pos}). Received: "
            f"TF_CONFIG={raw!r}. Set it to e.g. "
            '{"cluster": {"worker": ["host1:12345", "host2:12345"]}, '
            '"task": {"type": "worker", "index": 0}}.'
        ) from None
    if not isinstance(config, dict):
        raise ValueError(f"TF_CONFIG must be a JSON object. Received: TF_CONFIG={raw!r}.")
    cluster = config.get("cluster")
    if not cluster:
        return config
    if not isinstance(cluster, dict):
        raise ValueError(
            f"TF_CONFIG field 'cluster' must map task types to address lists. Received: "
            f"cluster={cluster!r}."
        )
    task = config.get("task")
    if not isinstance(task, dict) or "type" not in task or "index" not in task:
        raise ValueError(
            f"TF_CONFIG names a cluster but its field 'task' is missing or incomplete. "
            f"Received: task={task!r}. Add "
            '"task": {"type": "worker", "index": <this worker\'s position>}.'
        )
    task_type, index = task["type"], task["index"]
    if task_type not in cluster:
        raise ValueError(
            f"TF_CONFIG field 'task.type' is not a task type of the cluster. Received: "
            f"task.type={task_type!r}; the cluster has {sorted(cluster)}."
        )
    addresses = cluster[task_type]
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(addresses):
        raise ValueError(
            f"TF_CONFIG field 'task.index' is out of range. Received: task.index={index!r}; "
            f"the cluster has {len(addresses)} {task_type!r} task(s), so use 0 to "
            f"{len(addresses) - 1}."
        )
    return config


def count_workers(config: dict) -> int:
    """Workers (chief included) that a checked TF_CONFIG dict names; 1 without a cluster."""
    cluster = config.get("cluster") or {}
    return max(1, len(cluster.get("chief", [])) + len(cluster.get("worker", [])))


def _check_replicas(replicas) -> None:
    if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 1:
        raise ValueError(
            f"replicas must be a positive integer. Received: replicas={replicas!r}. "
            "Use e.g. replicas=2."
        )


def _default_devices(replicas: int | None) -> list[str]:
    gpus = _devices.physical_devices("GPU")
    if replicas is None:
        return [f"/gpu:{i}" for i in range(len(gpus))] or ["/cpu:0"]
    device_type = "GPU" if gpus else "CPU"
    if len(gpus) >= replicas:
        return [f"/gpu:{i}" for i in range(replicas)]
    return _devices.ensure_logical_devices(device_type, replicas)


def _cross_device_ops(choice):
    if isinstance(choice, tf.distribute.CrossDeviceOps):
        return choice
    if choice not in CROSS_DEVICE_OPS:
        raise ValueError(
            f"Unknown cross_device_ops. Received: cross_device_ops={choice!r}. Use one of "
            f"{', '.join(repr(c) for c in CROSS_DEVICE_OPS)}, or a "
            "tf.distribute.CrossDeviceOps instance."
        )
    if choice == "auto":
        return None
    if choice == "nccl":
        if not _devices.physical_devices("GPU"):
            raise ValueError(
                "cross_device_ops='nccl' needs GPUs, and this machine has none. Received: "
                "cross_device_ops='nccl'. Use 'auto' (collective ring on CPUs) or "
                "'reduce_to_one_device'."
            )
        return tf.distribute.NcclAllReduce()
    if choice == "hierarchical_copy":
        return tf.distribute.HierarchicalCopyAllReduce()
    return tf.distribute.ReductionToOneDevice()


def _multi_worker_options(choice) -> tf.distribute.experimental.CommunicationOptions:
    implementations = {
        "auto": tf.distribute.experimental.CommunicationImplementation.AUTO,
        "nccl": tf.distribute.experimental.CommunicationImplementation.NCCL,
    }
    if isinstance(choice, tf.distribute.CrossDeviceOps) or choice not in implementations:
        raise ValueError(
            f"Across several workers cross_device_ops must be 'auto' or 'nccl'. Received: "
            f"cross_device_ops={choice!r}. Use 'auto' (NCCL on GPUs, ring otherwise)."
        )
    return tf.distribute.experimental.CommunicationOptions(implementation=implementations[choice])


def _build_mirrored(devices, cross_device_ops):
    upstream.install()  # strategykit's fixes of Keras/TF gaps (see upstream.py)
    strategy = tf.distribute.MirroredStrategy.__new__(tf.distribute.MirroredStrategy)
    strategy._collective_key_base = next(_strategies_built) * _COLLECTIVE_KEYS_PER_STRATEGY
    strategy.__init__(devices=devices, cross_device_ops=cross_device_ops)
    return strategy
