"""The right `tf.distribute` strategy in one call: `mirrored()` and `from_env()`."""

from __future__ import annotations

import numbers

import tensorflow as tf

from strategykit import upstream
from strategykit.cluster import environments, progress_reporter, public_address, start_watch
from strategykit.cluster.own_port import check_port_free
from strategykit.made import strategies
from strategykit.pinning.legacy_keras import warn_if_legacy_keras
from strategykit.strategy import devices as _devices
from strategykit.upstream import strategy_internals
from strategykit.upstream.every_fit import add_to_every_fit

CROSS_DEVICE_OPS = ("auto", "nccl", "hierarchical_copy", "reduce_to_one_device")
"""The valid string values of `cross_device_ops`."""


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
    installs strategykit's fixes of upstream gaps (`strategykit/upstream/`; e.g.
    Keras's `gradient_accumulation_steps` under a strategy), as `from_env()` does.

    Args:
        devices: device names such as `["/gpu:0", "/gpu:1"]`, or the
            `tf.config.LogicalDevice`s of `tf.config.list_logical_devices()`. Default:
            as described above. Cannot be combined with `replicas`. A count is refused,
            not taken as `replicas`: `sk.mirrored(2)` raises a ValueError that names
            `sk.mirrored(replicas=2)`, since a number where device names belong is as
            likely a device index (`/gpu:2`) as a count.
        replicas: number of replicas, an int of at least 1. Default: every GPU, or 1
            CPU.
        cross_device_ops: how gradients are all-reduced: `"auto"` (default; NCCL on
            GPUs, TensorFlow's collective ring on CPUs), `"nccl"` (GPUs only),
            `"hierarchical_copy"`, `"reduce_to_one_device"`, or a
            `tf.distribute.CrossDeviceOps` instance.

    Returns:
        A `tf.distribute.MirroredStrategy`.

    Raises:
        ValueError: `devices` not a non-empty list of device names (a count among
            them: use `replicas=N`), an invalid `replicas` or `cross_device_ops`, both
            `devices` and `replicas`, or `"nccl"` on a machine without GPUs.
        RuntimeError: TensorFlow has already started with too few devices for `replicas`.

    Example:
        >>> import strategykit as sk
        >>> strategy = sk.mirrored(replicas=2)  # doctest: +SKIP
        >>> strategy.num_replicas_in_sync  # doctest: +SKIP
        2
    """
    warn_if_legacy_keras()
    if devices is not None:
        devices = _checked_devices(devices)
    if devices is not None and replicas is not None:
        raise ValueError(
            f"Pass either devices or replicas, not both. Received: devices={devices!r}, "
            f"replicas={replicas!r}. Use devices=[...] to name them, or replicas=N to get N."
        )
    if replicas is not None:
        replicas = _checked_replicas(replicas)
    ops = _single_machine_ops(cross_device_ops)
    if devices is None:
        devices = _default_devices(replicas)
    return _build_mirrored(devices, ops)


def from_env(*, cross_device_ops: str | tf.distribute.CrossDeviceOps = "auto"):
    """Builds the strategy the environment asks for: several workers, or one machine.

    The environment is the first of these that this process is in
    (`strategykit.cluster.environments`):

    1. `TF_CONFIG`, when set: by you, by `strategykit launch`, by Ray Train, or by Vertex
       AI, SageMaker or Azure ML (a `chief` task and extra keys such as `environment`,
       `job`, `trial` are understood; an `evaluator` task is an error naming the fix).
       It always wins.
    2. SLURM: a task of a job step of several tasks (`srun -n 4 python train.py`), one
       worker per task over the step's nodes (`strategykit.cluster.environments.slurm`;
       the tasks of a node listen on ports from `STRATEGYKIT_PORT`, default 8888).
    3. A Kubernetes JobSet or Indexed Job (`examples/kubernetes/`): the cluster from the
       pod's index, its hostname and `STRATEGYKIT_WORKERS`.
    4. One machine: `mirrored()`, every local GPU or the CPU.

    More than one worker makes this process one worker of a
    `tf.distribute.MultiWorkerMirroredStrategy`; one worker, `mirrored()`. A worker at a
    public address is warned about once (`strategykit.cluster.public_address`: its port
    is open to whoever reaches it).

    Args:
        cross_device_ops: `"auto"` (default) or `"nccl"` across workers; on a single
            machine any value `mirrored()` takes.

    Returns:
        A `tf.distribute.MultiWorkerMirroredStrategy` or a `tf.distribute.MirroredStrategy`.

    Raises:
        ValueError: the environment's variables are malformed or incomplete (the message
            names the variable: a `TF_CONFIG` field, a SLURM or Kubernetes variable,
            `STRATEGYKIT_PORT`, `STRATEGYKIT_HANG_TIMEOUT` or
            `STRATEGYKIT_START_TIMEOUT`), or `cross_device_ops` is
            neither `"auto"` nor `"nccl"` across workers.
        RuntimeError: under SLURM, the node list cannot be expanded (Slurm's `scontrol`
            is missing or fails) or a task is on another node than expected; this
            worker's port is already in use on this machine (`own_port`).

    While the strategy waits for every worker to connect, this worker says every 30 s
    on stderr which have not (`strategykit.cluster.start_watch`), and after
    `STRATEGYKIT_START_TIMEOUT` seconds (default 300, 0 off) exits with code 1.

    Example:
        >>> import strategykit as sk
        >>> strategy = sk.from_env()  # no TF_CONFIG, not under srun: one machine
        >>> strategy.num_replicas_in_sync  # doctest: +SKIP
        1

        On every worker, e.g. `srun -N 2 --ntasks-per-node=1 python train.py`, or with
        `TF_CONFIG='{"cluster": {"worker": ["host1:12345", "host2:12345"]}, "task":
        {"type": "worker", "index": 0}}'` on host1 (index 1 on host2), the same call
        returns one worker of a `MultiWorkerMirroredStrategy`.

    Under `strategykit launch` it also has this worker report its training progress to
    the launcher's hang watch (`strategykit.cluster.progress_reporter`). Without the
    launcher, each worker of several watches itself: no step completed for
    `STRATEGYKIT_HANG_TIMEOUT` seconds (default 300, 0 off) inside `fit()`,
    `evaluate()` or `predict()` ends it with code 124, so a stuck job fails instead of
    waiting forever (`strategykit.cluster.stall_watchdog`).
    """
    warn_if_legacy_keras()
    environment = environments.detect()
    if environment.workers() <= 1:
        _report_progress()
        return mirrored(cross_device_ops=cross_device_ops)
    options = _multi_worker_options(cross_device_ops)
    public_address.warn_if_public({"cluster": environment.task().cluster}, stacklevel=3)
    resolver = environment.resolver()
    _report_progress(environment.worker_index())
    upstream.install()
    return strategies.register(_multi_worker(resolver, options))


def _multi_worker(resolver, options) -> tf.distribute.MultiWorkerMirroredStrategy:
    """The strategy, once this worker's port is free, built under a watch that names the
    peers that never connect (`own_port`, `start_watch`)."""
    cluster = resolver.cluster_spec().as_dict()
    me = f"{resolver.task_type} {resolver.task_id}"
    check_port_free(cluster[resolver.task_type][resolver.task_id], me)
    with start_watch.watching_start(
            me, start_watch.peers(cluster, resolver.task_type, resolver.task_id)):
        return tf.distribute.MultiWorkerMirroredStrategy(
            cluster_resolver=resolver, communication_options=options)


def _checked_replicas(replicas) -> int:
    if isinstance(replicas, bool) or not isinstance(replicas, numbers.Integral) or replicas < 1:
        raise ValueError(
            f"replicas must be a positive integer. Received: replicas={replicas!r}. "
            "Use e.g. replicas=2."
        )
    return int(replicas)


def _checked_devices(devices) -> list[str]:
    """`devices` as a list of device names; a count, a single name or anything but
    names is refused with the fix."""
    if isinstance(devices, numbers.Integral) and not isinstance(devices, bool):
        raise ValueError(  # an int, np.int64, ...
            f"devices must be a list of device names, not a count. Received: devices="
            f"{devices} (an {type(devices).__name__}). For {devices} "
            f"replicas use sk.mirrored(replicas={devices}); to name devices, pass e.g. "
            "devices=['/gpu:0', '/gpu:1']."
        )
    try:
        names = list(devices) if not isinstance(devices, (str, bytes)) else None
    except TypeError:
        names = None
    names = [_device_name(device) for device in names or ()]
    if not names or not all(isinstance(name, str) for name in names):
        raise ValueError(
            f"devices must be a non-empty list of device names. Received: devices="
            f"{devices!r}. Use e.g. devices=['/gpu:0', '/gpu:1'], or replicas=N for N "
            "replicas."
        )
    for name in names:
        try:
            tf.DeviceSpec.from_string(name)
        except ValueError:
            raise ValueError(
                f"devices holds {name!r}, which is not a device name. Received: devices="
                f"{devices!r}. Use names such as '/gpu:0' or '/cpu:0'."
            ) from None
    return names


def _device_name(device):
    """A device's name: a string as it is, a `tf.config.LogicalDevice` by its name."""
    return device.name if isinstance(device, tf.config.LogicalDevice) else device


def _default_devices(replicas: int | None) -> list[str]:
    gpus = _devices.physical_devices("GPU")
    if replicas is None:
        return [f"/gpu:{i}" for i in range(len(gpus))] or ["/cpu:0"]
    device_type = "GPU" if gpus else "CPU"
    if len(gpus) >= replicas:
        return [f"/gpu:{i}" for i in range(replicas)]
    return _devices.ensure_logical_devices(device_type, replicas)


def _single_machine_ops(choice):
    """The `tf.distribute.CrossDeviceOps` that `mirrored()`'s `cross_device_ops` names
    (None: TensorFlow's choice)."""
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


def _report_progress(worker: int | None = None) -> None:
    """Every fit reports its progress: to `strategykit launch` under it; else, on worker
    `worker` of several, to the worker's own watch (`progress_reporter.reporter`)."""
    maker = progress_reporter.reporter(worker)
    if maker is not None:
        add_to_every_fit(maker)


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
    upstream.install()  # strategykit's fixes of Keras/TF gaps (see strategykit/upstream/)
    # Collective keys of its own: strategies of several sizes live in one process.
    return strategies.register(strategy_internals.mirrored_strategy(devices, cross_device_ops))
