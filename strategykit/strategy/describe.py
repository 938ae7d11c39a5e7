"""`describe(strategy)`: what a `tf.distribute` strategy runs on, as a plain dict."""

from __future__ import annotations

import tensorflow as tf

from strategykit.cluster.environments import count_workers
from strategykit.cluster.strategy_argument import check_strategy
from strategykit.strategy import devices as _devices
from strategykit.upstream import strategy_internals
from strategykit.xla.replica_steps import auto_xla


def describe(strategy: tf.distribute.Strategy | None = None) -> dict:
    """Says what a strategy runs on.

    Args:
        strategy: any `tf.distribute.Strategy`. Default: the current one
            (`tf.distribute.get_strategy()`, the default strategy outside any scope).

    Returns:
        A dict with keys `strategy` (class name), `replicas` (replicas in sync over all
        workers), `devices` (this worker's devices), `all_reduce` (the implementation
        that combines gradients: `"collective ring"`, `"collective nccl"`, `"nccl"`,
        `"hierarchical_copy"`, `"reduce_to_one_device"`, `"collective auto"` or
        `"none"` for one device), `workers` (processes taking part), `simulated`
        (whether several replicas share one physical device as logical devices) and
        `xla` (what `jit_compile="auto"` gives a model compiled in the strategy's
        scope: `"each replica"` where there is a GPU and several replicas, each
        replica's step compiled; `"whole step"` on one GPU; `"off"` on a machine
        without GPU, as on one device; `jit_compile=True` compiles anyway).

    Raises:
        ValueError: `strategy` is neither a `tf.distribute.Strategy` nor None.

    Example:
        >>> import strategykit as sk
        >>> sk.describe()["replicas"]
        1
    """
    check_strategy(strategy, optional=True)
    strategy = strategy or tf.distribute.get_strategy()
    names = _device_names(strategy)
    return {
        "strategy": _public_name(strategy),
        "replicas": strategy.num_replicas_in_sync,
        "devices": names,
        "all_reduce": _all_reduce_name(strategy),
        "workers": _count_workers(strategy),
        "simulated": _is_simulated(names),
        "xla": auto_xla(strategy),
    }


# The strategies whose devices are known, by their names under `tf.distribute` (the
# class behind MultiWorkerMirroredStrategy is called CollectiveAllReduceStrategy).
_PUBLIC_NAMES = {
    tf.distribute.OneDeviceStrategy: "OneDeviceStrategy",
    tf.distribute.MirroredStrategy: "MirroredStrategy",
    tf.distribute.MultiWorkerMirroredStrategy: "MultiWorkerMirroredStrategy",
}


def _public_name(strategy) -> str:
    for cls, name in _PUBLIC_NAMES.items():
        if isinstance(strategy, cls):
            return name
    return type(strategy).__name__


def _device_names(strategy) -> list[str]:
    if isinstance(strategy, tuple(_PUBLIC_NAMES)):
        return list(strategy.extended.worker_devices)
    first_gpu = _devices.logical_device_names("GPU")[:1]
    return first_gpu or _devices.logical_device_names("CPU")[:1]


def _count_workers(strategy) -> int:
    resolver = getattr(strategy, "cluster_resolver", None)
    return 1 if resolver is None else count_workers(resolver.cluster_spec().as_dict())


def _is_simulated(names: list[str]) -> bool:
    """Several of the strategy's devices of one type, but fewer physical ones."""
    for device_type in ("CPU", "GPU"):
        used = sum(f"{device_type}:" in name.upper() for name in names)
        if used > 1 and used > len(_devices.physical_devices(device_type)):
            return True
    return False


def _all_reduce_name(strategy) -> str:
    if strategy.num_replicas_in_sync == 1 and not isinstance(
        strategy, tf.distribute.MultiWorkerMirroredStrategy
    ):
        return "none"
    # TensorFlow has no public accessor for it: strategykit.upstream reads it.
    ops, options = strategy_internals.all_reduce_in_use(strategy)
    by_class = {
        tf.distribute.NcclAllReduce: "nccl",
        tf.distribute.HierarchicalCopyAllReduce: "hierarchical_copy",
        tf.distribute.ReductionToOneDevice: "reduce_to_one_device",
    }
    for cls, name in by_class.items():
        if type(ops) is cls:
            return name
    if options is None:
        return "unknown"
    return f"collective {options.implementation.name.lower()}"
