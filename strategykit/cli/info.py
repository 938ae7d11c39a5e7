"""`strategykit info`: versions, devices and the strategy this machine would build."""

from __future__ import annotations

import importlib.metadata
import json

import keras
import tensorflow as tf

from strategykit import upstream
from strategykit.cluster import environments
from strategykit.strategy import devices as _devices
from strategykit.strategy.build import mirrored
from strategykit.strategy.describe import describe


def collect(replicas: int | None = None) -> dict:
    """Gathers the facts `strategykit info` prints.

    Args:
        replicas: build the strategy `sk.mirrored(replicas=replicas)` would. Default:
            `sk.mirrored()` (every GPU, or the CPU).

    Returns:
        A dict with `tensorflow`, `keras`, `keras_hub` (its version, None where it is
        not installed; read without importing it), `environment` (where the workers of a job
        come from, as `sk.from_env()` detects it: `strategykit.cluster.environments`),
        `physical_devices`, `logical_devices`, `strategy` (what `sk.describe` says of
        that strategy), `checked_on` (the TensorFlow + Keras pairs strategykit was
        checked on) and `fixes` (each upstream fix and its state on the installed
        versions: `strategykit.upstream.status()`).

    Example:
        >>> from strategykit.cli.info import collect
        >>> collect()["strategy"]["replicas"]  # doctest: +SKIP
        1
    """
    strategy = mirrored(replicas=replicas)
    return {
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "keras_hub": _installed_version("keras-hub"),
        "environment": environments.detect().describe(),
        "physical_devices": {
            kind: len(_devices.physical_devices(kind)) for kind in ("CPU", "GPU")
        },
        "logical_devices": {kind: _devices.logical_device_names(kind) for kind in ("CPU", "GPU")},
        "strategy": describe(strategy),
        "checked_on": upstream.CHECKED_ON,
        "fixes": upstream.status(),
    }


def render(facts: dict, as_json: bool = False) -> str:
    """Formats `collect()`'s dict as an aligned table, or as JSON."""
    if as_json:
        return json.dumps(facts, indent=2)
    strategy = facts["strategy"]
    rows = [
        ("TensorFlow", facts["tensorflow"]),
        ("Keras", facts["keras"]),
        ("keras-hub", facts["keras_hub"] or "not installed (optional: strategykit[keras-hub])"),
        ("Environment", facts["environment"]),
        ("Physical devices", _count_text(facts["physical_devices"])),
        ("Logical devices", _count_text({k: len(v) for k, v in facts["logical_devices"].items()})),
        ("Strategy", strategy["strategy"]),
        ("Replicas", str(strategy["replicas"])),
        ("Devices", ", ".join(strategy["devices"])),
        ("All-reduce", strategy["all_reduce"]),
        ("Workers", str(strategy["workers"])),
        ("Simulated devices", "yes" if strategy["simulated"] else "no"),
        ("XLA by default", strategy["xla"]),
    ]
    width = max(len(label) for label, _ in rows)
    table = "\n".join(f"{label:<{width}}  {value}" for label, value in rows)
    return f"{table}\n\n{_fixes_text(facts)}"


_STATE_WORDS = {
    "installed": "installed",
    "not needed": "not needed (fixed upstream in this version)",
    "refusing": "REFUSES (unknown upstream code)",
    "upstream's own": "upstream's own (unknown upstream code, not needed for numbers)",
    "not installed": "not installed yet (sk.mirrored() or sk.shard() installs it)",
    "checked": "checked (private upstream code as pinned)",
    "on import": "installed when the program imports its package",
    "no package": "not applicable (its optional package is not installed)",
}


def _fixes_text(facts: dict) -> str:
    """One line per feature a fix serves: its state, the feature, the upstream issue,
    and for unknown code what differs."""
    lines = [f"Upstream fixes (checked on {facts['checked_on']}):"]
    features: dict = {}
    for fix in facts["fixes"]:
        entry = features.setdefault((fix["affects"], fix["issue"]), [])
        entry.append(fix)
    for (affects, issue), fixes in features.items():
        states = [fix["state"] for fix in fixes]
        state = next((s for s in ("refusing", "upstream's own", "not installed", "on import",
                                  "no package", "installed", "checked") if s in states),
                     "not needed")
        issue = issue.replace(" (unreported)", ", unreported")
        lines.append(f"  {_STATE_WORDS[state]}: {affects} ({issue})")
        for name in sorted({name for fix in fixes for name in fix["unknown"]}):
            lines.append(f"      differs: {name}")
    return "\n".join(lines)


def _installed_version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _count_text(counts: dict) -> str:
    return ", ".join(f"{count} {kind}" for kind, count in counts.items())
