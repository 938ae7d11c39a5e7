"""`TF_CONFIG`: the cluster as a JSON variable, however it was written.

`strategykit launch`, Ray Train, Vertex AI, SageMaker and Azure ML write it for every
worker, or you do by hand. Their shapes differ only in what TensorFlow ignores (extra
keys such as `environment`, `job`, `trial`) and in who is the chief: a `chief` task when
the cluster names one (Vertex AI), otherwise worker 0. Who wrote it is told by the
variables each writer sets beside it; it is only for `strategykit info`.
"""

from __future__ import annotations

import tensorflow as tf

from strategykit.cluster.environments.base import Environment, Task
from strategykit.cluster.tf_config import read_tf_config

_WRITERS = (  # (a variable set beside TF_CONFIG, or a prefix ending in "_"; who wrote it)
    ("STRATEGYKIT_WORKER", "strategykit launch"),
    ("CLUSTER_SPEC", "Vertex AI"),
    ("SM_TRAINING_ENV", "SageMaker"),
    ("AZUREML_", "Azure ML"),
)


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
