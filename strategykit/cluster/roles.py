"""Which worker this process is: `is_chief()`, `worker_index()`, `is_multi_worker()`.

A job of several worker processes has one chief: the task of type `"chief"` when the
cluster names one, otherwise worker 0. The chief writes the files (checkpoints, logs,
plots); the other workers train alongside it and write nothing that collides.
"""

from __future__ import annotations

import tensorflow as tf

from strategykit.cluster import environments
from strategykit.cluster.environments import Task, count_workers, worker_position
from strategykit.cluster.strategy_argument import check_strategy


def is_chief(strategy: tf.distribute.Strategy | None = None) -> bool:
    """True on the one worker that writes files; True on a single machine.

    Use it for your own files in a script that runs on several workers, so that only one
    worker writes them.

    Args:
        strategy: the strategy the job trains under. Default None: the environment
            `sk.from_env()` reads (`TF_CONFIG`, a SLURM step of several tasks, a
            Kubernetes Job; `strategykit.cluster.environments`), or a single machine.

    Returns:
        True on the chief (the task of type `"chief"`, otherwise worker 0) and whenever
        there is one worker only; False on every other worker.

    Raises:
        ValueError: `strategy` is neither a `tf.distribute.Strategy` nor None.

    Example:
        >>> import strategykit as sk
        >>> sk.is_chief()  # one machine, no TF_CONFIG
        True
    """
    check_strategy(strategy, optional=True)
    task = _task(strategy)
    if task.type == "chief":
        return True
    return task.type == "worker" and task.index == 0 and not task.cluster.get("chief")


def worker_index(strategy: tf.distribute.Strategy | None = None) -> int:
    """This worker's position in the job: 0 for the chief, then the workers in order.

    Args:
        strategy: as for `is_chief`. Default None: the environment `sk.from_env()` reads.

    Returns:
        The index of this worker among every worker of the job (0 on one machine).
    """
    return worker_position(_task(strategy))


def is_multi_worker(strategy: tf.distribute.Strategy) -> bool:
    """True when `strategy` trains across several worker processes."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) or resolver is None:
        return False
    return count_workers(resolver.cluster_spec().as_dict()) > 1


def _task(strategy) -> Task:
    """This worker's task; `Task("worker", 0, {})` for a single worker.

    Without a strategy: the environment `sk.from_env()` reads (`environments.detect()`).
    """
    if strategy is not None:
        if not is_multi_worker(strategy):
            return _ALONE
        resolver = strategy.cluster_resolver
        return Task(resolver.task_type, int(resolver.task_id), resolver.cluster_spec().as_dict())
    environment = environments.detect()
    if environment.workers() <= 1:
        return _ALONE
    return environment.task()


_ALONE = Task("worker", 0, {})  # the task of a worker that trains alone
