"""keras-team/keras#20582: `gradient_accumulation_steps` under a `tf.distribute` strategy."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from strategykit.made import strategies
from strategykit.pinning.fix import Fix, by_fingerprint, original, resolve

# Every micro-step all-reduces its gradients (True), or each replica accumulates its own
# and the sums are all-reduced once per update (False, the default; see the fix below).
# The other way is kept for benchmarks/accumulation.py, which measures both.
_REDUCE_EVERY_MICRO_STEP = False

# -- keras-team/keras#20582: gradient_accumulation_steps under a tf.distribute strategy --
#
# Upstream `BaseOptimizer._backend_apply_gradients` chooses between "update" and "add to
# the accumulators" with `ops.cond` in the replica context. Both branches end in
# `merge_call` (the all-reduce and `distribute.extended.update`), which TensorFlow
# refuses inside a cond branch: `RuntimeError: merge_call called while defining a new
# graph or a tf.function`, under MirroredStrategy and MultiWorkerMirroredStrategy alike
# (they merge-call except under XLA on GPUs). There is no public route: the optimizer's
# step is not a hook, and wrapping the user's optimizer would change their class. So the
# TF backend's optimizer class gets its own `_backend_apply_gradients` that, under a
# strategy and only with gradient_accumulation_steps, makes ONE merge_call first and
# does the step in the cross-replica context, with `extended.update` (per replica) and
# `extended.batch_reduce_to` inside its cond (no merge_call there). Semantics are
# upstream's, exactly: `_iterations` counts micro-steps (the public `iterations` is
# `_iterations // K`, so Adam's bias correction and the optimizer state move once per K
# micro-steps); on the K-th the step applies (g + accumulated) / K, then clipping, weight
# decay, `update_step` and a reset of the accumulators; learning-rate schedules see the
# micro-step count, as upstream documents. Reduction: like upstream's TF backend (which
# adds un-reduced gradients to its accumulators), every replica accumulates its own
# gradients and the sums are all-reduced once per update, K-1 fewer all-reduces than
# reducing every micro-step. The accumulators then differ between replicas inside a
# window, so a checkpoint holds replica 0's only between updates. A backup of
# `sk.callbacks.BackupAndRestore` keeps a window in progress whole: `window_sums` (the
# accumulators summed over the replicas) beside Keras's files, and `resume_window` after
# Keras's restore (sums / replicas on every replica: the update's all-reduce adds them up).


def _applies(optimizer, *args, **kwargs) -> bool:
    """Accumulation in a replica context of a strategy strategykit made or sharded for,
    where upstream fails (under any other strategy upstream's own code runs, and fails)."""
    return bool(optimizer.gradient_accumulation_steps and strategies.in_ours()
                and tf.distribute.get_replica_context() is not None)


def _accumulating_apply_gradients(self, grads, trainable_variables):
    if not _applies(self):
        return original(_tf_optimizer(), "_backend_apply_gradients")(
            self, grads, trainable_variables)
    context = tf.distribute.get_replica_context()
    grads = list(grads)
    if _REDUCE_EVERY_MICRO_STEP:
        grads = context.all_reduce(tf.distribute.ReduceOp.SUM, grads)
    context.merge_call(_accumulate, args=(grads,),
                       kwargs={"optimizer": self, "variables": list(trainable_variables)})
    # EMA as upstream, in the replica context where it works (`ema_overwrite_frequency`
    # fails there as upstream does without accumulation: a separate upstream gap).
    if self.use_ema:
        self._update_model_variables_moving_average(self._trainable_variables)
        if self.ema_overwrite_frequency:
            should_overwrite = (self.iterations + 1) % self.ema_overwrite_frequency == 0
            tf.cond(should_overwrite,
                    lambda: self._overwrite_model_variables_with_average_value(
                        self._trainable_variables),
                    lambda: None)
    if by_fingerprint(_BASE_APPLY_GRADIENTS, _KERAS_COUNTS_IN_APPLY_GRADIENTS):
        self._iterations.assign_add(1)


# Where Keras counts a micro-step in `_iterations`, by the fingerprint of
# `BaseOptimizer._backend_apply_gradients`: at its end on Keras 3.8 and 3.9 (the replaced
# method must then count, or no update ever comes), in `BaseOptimizer.apply` from 3.10.
_KERAS_COUNTS_IN_APPLY_GRADIENTS = {
    "90f49235e544f3f1": True,  # Keras 3.8.0 to 3.9.2
    "48d6e24d58039241": False,  # Keras 3.10.0 to 3.15.1
}
_BASE_APPLY_GRADIENTS = "keras.src.optimizers.base_optimizer:BaseOptimizer._backend_apply_gradients"


def _accumulate(strategy, grads, *, optimizer, variables):
    """The accumulation step in the cross-replica context; `grads` are per replica."""
    steps = optimizer.gradient_accumulation_steps
    variables = [getattr(v, "value", v) for v in variables]  # Keras -> tf variables
    accumulators = [optimizer._accumulated_gradients[optimizer._get_variable_index(v)].value
                    for v in variables]
    # Every micro-step adds each replica's gradients to its own accumulators, outside the
    # cond, which then holds only the update; upstream adds `g + accumulated` at the
    # update instead (the same sum). Reads in the cond come after these assignments
    # (automatic control dependencies order ops on the same variable).
    for grad, accumulator in zip(grads, accumulators):
        strategy.extended.update(accumulator, _add, args=(grad,), group=False)

    def update():
        total = _local_map(strategy, lambda a: [x.read_value() for x in a], accumulators)
        if not _REDUCE_EVERY_MICRO_STEP:
            total = strategy.extended.batch_reduce_to(
                tf.distribute.ReduceOp.SUM, list(zip(total, accumulators)))
        mean = _local_map(strategy, lambda t: optimizer._clip_gradients([x / steps for x in t]),
                          total)
        if optimizer.weight_decay is not None:
            for variable in variables:
                strategy.extended.update(variable, _weight_decay, args=(optimizer,), group=False)
        optimizer._distributed_tf_update_step(strategy, list(zip(mean, variables)),
                                              optimizer.learning_rate)
        optimizer._backend_reset_gradient_accumulators()

    tf.cond((optimizer._iterations + 1) % steps == 0, update, lambda: None)


def _local_map(strategy, fn, values):
    """`fn(components)` on each replica's components of `values`, as per-replica values.

    `values` is a list of distributed values or variables; `fn` gets one replica's
    components of them, in order, and returns a list of tensors (on that device).
    """
    local = [strategy.experimental_local_results(v) for v in values]
    replicas = len(local[0])
    outputs = []
    for r in range(replicas):
        with tf.device(local[0][r].device):
            outputs.append(fn([components[r] for components in local]))
    return [strategy.experimental_distribute_values_from_function(
        lambda context, i=i: outputs[context.replica_id_in_sync_group % replicas][i])
        for i in range(len(outputs[0]))]


def _add(accumulator, grad):
    return accumulator.assign_add(grad)


def _weight_decay(variable, optimizer):
    """Upstream `_apply_weight_decay` on one replica's copy, as its TF backend does it."""
    if optimizer._use_weight_decay(variable):
        lr = tf.cast(optimizer.learning_rate, variable.dtype)
        decay = tf.cast(optimizer.weight_decay, variable.dtype)
        variable.assign_sub(variable * decay * lr)


def window_sums(optimizer, strategy) -> list[np.ndarray] | None:
    """The gradients accumulated so far in the window in progress, summed over the
    replicas, where each replica accumulates its own (several replicas of a strategy
    strategykit made); None elsewhere (Keras's checkpoint then holds the whole state).
    Across workers every worker must call it (an all-reduce)."""
    accumulators = getattr(optimizer, "_accumulated_gradients", None)
    if not (optimizer.gradient_accumulation_steps and accumulators and
            strategies.is_ours(strategy) and strategy.num_replicas_in_sync > 1):
        return None
    variables = [accumulator.value for accumulator in accumulators]
    local = _local_map(strategy, lambda a: [x.read_value() for x in a], variables)
    return [strategy.reduce(tf.distribute.ReduceOp.SUM, value, axis=None).numpy()
            for value in local]


def resume_window(optimizer, strategy, sums: list[np.ndarray]) -> None:
    """Sets the accumulators to `window_sums` of a backup on any number of replicas:
    `sums / replicas` on each, which the window's update adds up to `sums` again."""
    replicas = strategy.num_replicas_in_sync
    with strategy.scope():
        for accumulator, total in zip(optimizer._accumulated_gradients, sums, strict=True):
            accumulator.assign(total / replicas)


def _tf_optimizer() -> type:
    return resolve(_OPTIMIZER)


_OPTIMIZER = "keras.src.backend.tensorflow.optimizer:TFOptimizer"
_BASE = "keras.src.optimizers.base_optimizer:BaseOptimizer"

FIXES = (
    Fix(
        issue="keras-team/keras#20582",
        affects="gradient_accumulation_steps under a tf.distribute strategy",
        owner=_OPTIMIZER,
        attribute="_backend_apply_gradients",
        replacement=_accumulating_apply_gradients,
        refuses_when=_applies,
        # The code read or called above, and how upstream accumulates. Where a name has
        # several fingerprints, the first is Keras 3.15.1's; each was checked.
        relies_on={
            f"{_BASE}.__init__": "7d5c171dfc92e81f",  # _iterations: only_first_replica
            # counts micro-steps in _iterations from 3.11 (3.8: _backend_apply_gradients)
            f"{_BASE}.apply": ("43097be63b919d03", "95ecde5a8bba76af"),
            # _accumulated_gradients (3.8 makes the EMA variables one by one)
            f"{_BASE}.build": ("e9d310fddad51ed1", "715ea549b368386f"),
            f"{_BASE}.iterations": "03eb6e7ab4b8a5f3",  # _iterations // K
            # replaced; EMA, and whether it counts the micro-step
            _BASE_APPLY_GRADIENTS: tuple(_KERAS_COUNTS_IN_APPLY_GRADIENTS),
            f"{_BASE}._clip_gradients": "152b956e23c91ad9",
            f"{_BASE}._use_weight_decay": "0e73208c5bf5328d",
            f"{_BASE}._backend_reset_gradient_accumulators": ("4e9ad3b3e598cfb6",
                                                              "c1a42853f8c5a8ad"),
            f"{_OPTIMIZER}._var_key": "726df115036636bc",
            f"{_OPTIMIZER}._apply_weight_decay": "fee6526b6ad02f94",  # as _weight_decay
            f"{_OPTIMIZER}._distributed_tf_update_step": "ec83c95231ba33ee",
            f"{_OPTIMIZER}._backend_increment_gradient_accumulators": "5e5ed334c33b5a56",
        },
    ),
)
