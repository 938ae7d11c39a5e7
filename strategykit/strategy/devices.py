"""Local devices: which exist, and splitting one into several logical devices.

TensorFlow fixes its device list once per process, when its runtime starts (the first op,
the first strategy, `tf.config.list_logical_devices`). Before that moment one physical
CPU or GPU can be split into several *logical* devices, which lets a laptop, CI or a
notebook run real multi-replica code. After it, the split cannot change; this module
then checks whether the devices that exist suffice and says how to fix it when not.
"""

from __future__ import annotations

import tensorflow as tf

DEFAULT_VIRTUAL_GPU_MEMORY_MB = 1024
"""Memory limit of each logical GPU made by splitting a physical GPU, in MiB."""

_RESTART_HINT = (
    "Call sk.mirrored(replicas=...) before any other TensorFlow work in the process "
    "(in a notebook: restart the kernel and run it first)."
)


def physical_devices(device_type: str) -> list:
    """The physical devices of a type (`"CPU"` or `"GPU"`); never starts the runtime."""
    return tf.config.list_physical_devices(device_type)


def logical_device_names(device_type: str) -> list[str]:
    """The names of the logical devices of a type. Starts the TensorFlow runtime."""
    return [device.name for device in tf.config.list_logical_devices(device_type)]


def is_simulated(device_type: str) -> bool:
    """Whether the logical devices of a type are splits of fewer physical devices."""
    return len(logical_device_names(device_type)) > len(physical_devices(device_type))


def ensure_logical_devices(
    device_type: str, count: int, *, memory_limit_mb: int | None = None
) -> list[str]:
    """Makes sure at least `count` logical devices of `device_type` exist.

    The physical devices are split evenly into logical ones when there are fewer than
    `count`. A split that already gives enough devices is kept, never shrunk.

    Args:
        device_type: `"CPU"` or `"GPU"`.
        count: how many logical devices are needed, at least 1.
        memory_limit_mb: memory limit of each logical GPU, in MiB (GPU only). Default:
            `DEFAULT_VIRTUAL_GPU_MEMORY_MB`.

    Returns:
        The names of the first `count` logical devices of that type.

    Raises:
        ValueError: `count` does not divide evenly over several physical GPUs.
        RuntimeError: TensorFlow's runtime has already started with too few devices.

    Example:
        >>> from strategykit.strategy.devices import ensure_logical_devices
        >>> ensure_logical_devices("CPU", 2)  # doctest: +SKIP
        ['/device:CPU:0', '/device:CPU:1']
    """
    physical = physical_devices(device_type)
    if not physical:
        raise RuntimeError(f"This machine has no {device_type} device; cannot make {count}.")
    per_device, remainder = divmod(count, len(physical))
    if remainder:
        raise ValueError(
            f"{count} replicas do not split evenly over {len(physical)} physical "
            f"{device_type}s. Received: replicas={count}. Use a multiple of {len(physical)}, "
            f"or pass devices=[...] explicitly."
        )
    if _configured_count(physical) < count:
        _try_split(physical, max(per_device, 1), device_type, memory_limit_mb)
    names = logical_device_names(device_type)
    if len(names) < count:
        raise RuntimeError(
            f"{count} {device_type} replicas were requested, but TensorFlow has already "
            f"started with {len(names)} logical {device_type} device(s): {names}. Logical "
            f"devices can only be made before TensorFlow's runtime starts. {_RESTART_HINT}"
        )
    return names[:count]


def _configured_count(physical: list) -> int:
    """How many logical devices the current configuration gives (1 per unsplit device)."""
    total = 0
    for device in physical:
        configuration = tf.config.get_logical_device_configuration(device)
        total += len(configuration) if configuration else 1
    return total


def _try_split(physical, per_device, device_type, memory_limit_mb) -> None:
    if device_type == "GPU":
        limit = memory_limit_mb or DEFAULT_VIRTUAL_GPU_MEMORY_MB
        make = lambda: tf.config.LogicalDeviceConfiguration(memory_limit=limit)  # noqa: E731
    else:
        make = tf.config.LogicalDeviceConfiguration
    try:
        for device in physical:
            tf.config.set_logical_device_configuration(
                device, [make() for _ in range(per_device)]
            )
    except RuntimeError:
        # The runtime has started: the device list is fixed. The caller checks
        # whether what exists suffices and explains the fix when it does not.
        pass
