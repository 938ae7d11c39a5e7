"""`TF_CONFIG`: the cluster as a JSON variable, however it was written.

`strategykit launch`, Ray Train, Vertex AI, SageMaker and Azure ML write it for every
worker, or you do by hand. Their shapes differ only in what TensorFlow ignores (extra
keys such as `environment`, `job`, `trial`) and in who is the chief: a `chief` task when
the cluster names one (Vertex AI), otherwise worker 0. Who wrote it is told by the
variables each writer sets beside it; it is only for `strategykit info`.

This module reads and checks it (`read_tf_config`) and puts it behind the common
interface (`TFConfig`). On the first of two workers it is e.g. `{"cluster": {"worker":
["host1:12345", "host2:12345"]}, "task": {"type": "worker", "index": 0}}`.
"""

from __future__ import annotations

import json
import os

import tensorflow as tf

from strategykit.cluster.environments.base import TRAINING_TASK_TYPES, Environment, Task
from strategykit.cluster.environments.cluster_addresses import check_cluster
from strategykit.launcher.worker_contract import WORKER_VARIABLE

_WRITERS = (  # (a variable set beside TF_CONFIG, or a prefix ending in "_"; who wrote it)
    (WORKER_VARIABLE, "strategykit launch"),
    ("CLUSTER_SPEC", "Vertex AI"),
    ("SM_TRAINING_ENV", "SageMaker"),
    ("AZUREML_", "Azure ML"),
)

def read_tf_config(raw: str | None = None) -> dict:
    """Reads and checks `TF_CONFIG` (or `raw`); `{}` when it is unset or empty.

    Keys other than `cluster` and `task` (Vertex AI, SageMaker and Azure ML add
    `environment`, `job`, `trial`, ...) are kept and ignored.

    Raises:
        ValueError: bad JSON, no `cluster` or `task`, a task type not in the cluster, an
            `evaluator` task, a cluster with other task types than `chief` and `worker`,
            a task type's addresses not a list of `"host:port"` strings, two tasks at one
            address (`cluster_addresses`), or a task index out of range.
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
    check_cluster(cluster)
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


class TFConfig(Environment):
    """The cluster that `TF_CONFIG` describes.

    Example:
        >>> config = ('{"cluster": {"chief": ["c:2222"], "worker": ["w0:2222", "w1:2222"]},'
        ...           ' "task": {"type": "worker", "index": 1}, "environment": "cloud"}')
        >>> environment = TFConfig({"TF_CONFIG": config, "CLUSTER_SPEC": "{}"})
        >>> environment.describe(), environment.workers(), environment.worker_index()
        ('TF_CONFIG (Vertex AI)', 3, 2)
    """

    name = "TF_CONFIG"

    def detected(self) -> bool:
        return bool(self.environ.get("TF_CONFIG", "").strip())

    def task(self) -> Task:
        config = read_tf_config(self.environ.get("TF_CONFIG", ""))
        if not config.get("cluster"):
            return Task("worker", 0, {})
        task = config["task"]
        return Task(task["type"], task["index"], config["cluster"])

    def describe(self) -> str:
        for variable, writer in _WRITERS:
            prefix = variable.endswith("_")
            if any(key.startswith(variable) if prefix else key == variable
                   for key in self.environ):
                return f"{self.name} ({writer})"
        return self.name

    def resolver(self) -> tf.distribute.cluster_resolver.ClusterResolver:
        """TensorFlow's own reader of `TF_CONFIG` (which it reads from `os.environ`)."""
        return tf.distribute.cluster_resolver.TFConfigClusterResolver()
