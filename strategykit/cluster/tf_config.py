"""Reading `TF_CONFIG`, the cluster description of a job of several worker processes.

`TF_CONFIG` is set by `strategykit launch`, by a Kubernetes training operator, or by
hand: `{"cluster": {"worker": ["host1:12345", "host2:12345"]}, "task": {"type":
"worker", "index": 0}}` on the first of two workers.
"""

from __future__ import annotations

import json
import os

TRAINING_TASK_TYPES = ("chief", "worker")
"""The task types of a cluster that train together under MultiWorkerMirroredStrategy."""


def read_tf_config(raw: str | None = None) -> dict:
    """Reads and checks `TF_CONFIG` (or `raw`); `{}` when it is unset or empty.

    Keys other than `cluster` and `task` (Vertex AI, SageMaker and Azure ML add
    `environment`, `job`, `trial`, ...) are kept and ignored.

    Raises:
        ValueError: bad JSON, no `cluster` or `task`, a task type not in the cluster, an
            `evaluator` task, a cluster with other task types than `chief` and `worker`,
            or a task index out of range.
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
    if task_type == "evaluator":
        raise ValueError(
            "TF_CONFIG makes this process the 'evaluator' task, which trains nothing: "
            "strategykit trains on the chief and the workers of the cluster only. Received: "
            f"task={task!r}. Run the job without an evaluator (Vertex AI: no evaluator "
            "worker pool), or have this process evaluate the chief's checkpoints without "
            "sk.from_env()."
        )
    unsupported = sorted(set(cluster) - set(TRAINING_TASK_TYPES))
    if unsupported:
        raise ValueError(
            f"TF_CONFIG's cluster has task types strategykit does not train with: "
            f"{unsupported}. Received: cluster task types {sorted(cluster)}. Use only "
            "'chief' (at most one) and 'worker' tasks: strategykit builds a "
            "MultiWorkerMirroredStrategy, in which every task trains ('ps' parameter "
            "servers belong to ParameterServerStrategy)."
        )
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
