"""Each replica's step compiled with XLA, the cross-replica parts left to TensorFlow.

Keras compiles its whole step function with XLA, `strategy.run` included; under a
`MirroredStrategy` of several replicas that function runs on the first device and fails
reaching another replica's copies (keras-team/keras#19005, the fix that builds Keras's
steps this way: `strategykit.upstream.xla_steps`). Here, public TensorFlow API only:

* `compiling_each_replica(step)`: every operation a replica's step creates in its
  replica context (the forward and backward pass, the loss, the metrics' updates) is
  marked for XLA with `tf.xla.experimental.jit_scope`, and TensorFlow compiles the
  marked operations of each device together (one XLA cluster per device and stretch
  between synchronization points). The operations of a `merge_call` (the all-reduce of
  the gradients and of synchronized batch norm's moments, the optimizer's update of
  every copy) run in the cross-replica context and are not marked, nor are collectives.
* `building_without_whole_step_xla(model)`: Keras builds its step function with the
  model's `jit_compile` off, and on again after; `predicting_per_replica(model)` does the
  same for a `predict()` call around a `predict_step` compiled per replica (Keras
  compiles it per replica itself, which TensorFlow 2.18 places on the first device).
* `auto_xla(strategy)`: what `jit_compile="auto"` gives in a strategy's scope.

One graph is shared by the replicas' threads, which trace in turns, so the scope is
entered by the first replica to start and left by the last to finish; whether an
operation is marked is decided by the thread that creates it.
"""

from __future__ import annotations

import contextlib
import functools
import threading

import tensorflow as tf

from strategykit.made import strategies

_scopes: dict = {}  # graph -> [replicas inside, the entered jit_scope]
_lock = threading.Lock()


def compiles_each_replica(model) -> bool:
    """Whether `model`'s steps compile per replica: `jit_compile` on (True, or "auto"
    resolved to True), not eager, on a strategy of strategykit's of several replicas."""
    strategy = model.distribute_strategy
    return (not model.run_eagerly and model.jit_compile is True
            and strategies.is_ours(strategy) and strategy.num_replicas_in_sync > 1)


@contextlib.contextmanager
def building_without_whole_step_xla(model):
    """Keras builds its step function without compiling it whole where each replica's
    step compiles instead (`compiles_each_replica`)."""
    if not compiles_each_replica(model):
        yield
        return
    model.jit_compile = False
    try:
        yield
    finally:
        model.jit_compile = True


@contextlib.contextmanager
def predicting_per_replica(model):
    """During a `predict()` call, where each replica's step compiles: Keras builds its
    predict function without XLA around a `predict_step` compiled per replica."""
    if not compiles_each_replica(model):
        yield
        return
    model.predict_step = compiling_each_replica(model.predict_step)
    try:
        with building_without_whole_step_xla(model):
            yield
    finally:
        del model.predict_step


def compiling_each_replica(step_function):
    """`step_function` with every operation it creates in a replica context marked for
    XLA (see the module docstring)."""

    @functools.wraps(step_function)
    def step(data):
        with _replica_scope():
            return step_function(data)

    return step


def _in_a_replica() -> bool:
    return tf.distribute.has_strategy() and not tf.distribute.in_cross_replica_context()


def _marks(node_def) -> bool:
    """Every operation a replica creates, except collectives (a strategy that all-reduces
    without a merge_call creates them in the replica context)."""
    return _in_a_replica() and not node_def.op.startswith(_COLLECTIVES)


_COLLECTIVES = ("Collective", "Nccl")


@contextlib.contextmanager
def _replica_scope():
    graph = tf.compat.v1.get_default_graph()
    with _lock:
        entry = _scopes.setdefault(graph, [0, None])
        if entry[0] == 0:
            entry[1] = tf.xla.experimental.jit_scope(compile_ops=_marks)
            entry[1].__enter__()
        entry[0] += 1
    try:
        yield
    finally:
        with _lock:
            entry[0] -= 1
            if entry[0] == 0:
                scope, entry[1] = entry[1], None
                del _scopes[graph]
                scope.__exit__(None, None, None)


def auto_xla(strategy) -> str:
    """What `jit_compile="auto"` gives a model compiled in `strategy`'s scope whose
    layers all support XLA: `"each replica"` (several replicas, a GPU: each replica's
    step compiled), `"whole step"` (one replica, a GPU: Keras compiles the whole step)
    or `"off"` (no GPU, as Keras decides on one device; `jit_compile=True` compiles
    anyway).

    Example:
        >>> import tensorflow as tf

from strategykit.made import strategies
        >>> auto_xla(tf.distribute.get_strategy()) in ("off", "whole step")
        True
    """
    if not has_accelerator():
        return "off"
    return "each replica" if strategy.num_replicas_in_sync > 1 else "whole step"


def has_accelerator() -> bool:
    """Whether the machine has a GPU (or another device than CPUs)."""
    return any(device.device_type != "CPU" for device in tf.config.list_physical_devices())
