"""Preemption: SIGTERM or SIGHUP to any worker makes every worker stop after the same step.

Clusters preempt with SIGTERM and kill a grace period later. `Preemption` catches
SIGTERM during `fit()` (TensorFlow's coordination service would otherwise swallow it)
and, at the end of each training step, tells `sk.callbacks.BackupAndRestore` whether
to back up and exit now. One process stops after the step it is in. Across workers,
the first worker to receive the signal publishes "stop after step n + 1" in the job's
key-value store (`strategykit.upstream.coordination`) and waits until every worker has
seen it before it runs step n + 1: no worker can finish that step without it (its
gradients are all-reduced), so every worker stops after the same step. This is the
protocol of TensorFlow's `PreemptionCheckpointHandler`.

SIGHUP (a closed terminal, a dropped ssh session) is treated as SIGTERM during `fit()`;
both signals get their previous handlers back when `fit()` ends.
"""

from __future__ import annotations

import itertools
import signal
import threading

import tensorflow as tf

from strategykit.cluster.environments.base import TRAINING_TASK_TYPES
from strategykit.cluster.roles import is_multi_worker
from strategykit.upstream import coordination

_DONE = "done"
_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
_caught = {"previous": {}, "current": None}  # each signal's handler before ours
_fits = itertools.count()  # one key space per fit, the same on every worker


class Preemption:
    """Watches for SIGTERM during one `fit()` and says when to back up and stop.

    Args:
        strategy: the fit's strategy.
    """

    def __init__(self, strategy: tf.distribute.Strategy):
        self._workers, self._own = _job_tasks(strategy) if is_multi_worker(strategy) else (
            None, None)
        prefix = f"strategykit/preemption/{next(_fits)}"
        self._stop_key = f"{prefix}/stop-after-step"
        self._ack_key = f"{prefix}/seen-by/"
        self._signalled = threading.Event()
        self.signal_name = "SIGTERM"  # the signal that stopped training
        self._stop_after: int | None = None
        self._published = False

    def start(self) -> None:
        """Catches SIGTERM and SIGHUP (in the main thread) and, across workers, watches
        the job."""
        for signum in _SIGNALS:
            if signum not in _caught["previous"]:
                try:
                    _caught["previous"][signum] = signal.signal(signum, _on_sigterm)
                except ValueError:  # not the main thread: the signal stays as it was
                    pass
        _caught["current"] = self  # a fit that raised never stopped: this one replaces it
        if self._workers is not None:
            threading.Thread(target=self._watch, daemon=True,
                             name="strategykit-preemption-watch").start()

    def stop(self) -> None:
        """Gives SIGTERM and SIGHUP back to their handlers before `fit()`.

        A signal that came too late to stop training (its last step was done) does not
        end the process: your code after `fit()` (saving the model, say) still runs, and
        the scheduler ends the process when its grace period is over."""
        if self._workers is not None:
            coordination.set_key(self._stop_key, _DONE)  # releases every watcher
        previous = _caught["previous"]
        _caught.update(previous={}, current=None)
        for signum, handler in previous.items():
            # None: a handler not set from Python (TensorFlow's, which ignores SIGTERM)
            signal.signal(signum, handler or signal.SIG_DFL)

    def after_step(self, step: int) -> bool:
        """Whether to back up and stop now, after the `step`-th step of this fit."""
        if self._stop_after is not None:
            return step >= self._stop_after
        if not self._signalled.is_set() or self._published:
            return False
        if self._workers is None:
            self._stop_after = step
            return True
        self._published = True
        if coordination.set_key(self._stop_key, str(step + 1)):
            for worker in self._workers:  # each one's watcher has seen it
                coordination.wait_for_key(self._ack_key + worker)
        return False

    def _watch(self) -> None:
        value = coordination.wait_for_key(self._stop_key)
        if value != _DONE:
            self._stop_after = int(value)
            coordination.set_key(self._ack_key + self._own, "1")


def _on_sigterm(signum, frame) -> None:
    """This process's SIGTERM and SIGHUP handler during `fit()`: noted, acted on after
    the step."""
    if _caught["current"] is not None:
        _caught["current"].signal_name = signal.Signals(signum).name
        _caught["current"]._signalled.set()


def _job_tasks(strategy: tf.distribute.Strategy) -> tuple[list[str], str]:
    """Every task of the job and this one, as `"type:index"`."""
    resolver = strategy.cluster_resolver
    spec = resolver.cluster_spec().as_dict()
    tasks = [f"{job}:{index}" for job in TRAINING_TASK_TYPES if job in spec
             for index in range(len(spec[job]))]
    return tasks, f"{resolver.task_type}:{resolver.task_id}"
