"""keras-team/keras (unreported): gradient clipping of the global batch's gradient.

`clipnorm`, `global_clipnorm` and `clipvalue` (any Keras optimizer; every Transformer
recipe sets `global_clipnorm`) clip in `BaseOptimizer._backend_apply_gradients`, before
`TFOptimizer._backend_update_step` all-reduces the gradients. Under a strategy each
replica so clips its own gradient, of its own examples, and the clipped gradients are
summed: not one device's clipping of the global batch's gradient. A Dense regression
with SGD(0.1) on 4 replicas ends 0.027 (`global_clipnorm=0.1`), 0.045 (`clipnorm=0.1`)
and 0.012 (`clipvalue=0.01`) away from one device after 4 steps. tf.keras had the same
gap and refused clipping under a strategy (tensorflow/tensorflow#33929); Keras 3 clips
silently.

The fix moves the clipping after the all-reduce: under a strategy of several replicas
that strategykit made or sharded for (`strategykit.made.strategies`),
in a replica context (`fit()`, a custom `train_step`, `optimizer.apply_gradients` in
`strategy.run`), `_clip_gradients` hands the gradients on unclipped and
`_backend_update_step` all-reduces them (`_all_reduce_sum_gradients`, sparse gradients
included), clips the sum with Keras's own `_clip_gradients`, then updates every replica's
variables as Keras does. The same number of all-reduces as without clipping. Weight decay,
which Keras applies between the two, does not read the gradients. With
`gradient_accumulation_steps` the accumulation fix clips the reduced mean itself
(`strategykit.upstream.accumulation`), and a `LossScaleOptimizer` unscales before its
inner optimizer clips, as on one device. Everywhere else Keras's own code runs.
Checked on Keras 3.8.0 to 3.15.1 with TensorFlow 2.18.1 to 2.21.0.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from strategykit.made import strategies
from strategykit.pinning.fix import Fix, original, resolve

_TF_OPTIMIZER = "keras.src.backend.tensorflow.optimizer:TFOptimizer"
_BASE = "keras.src.optimizers.base_optimizer:BaseOptimizer"


def clips(optimizer) -> bool:
    """Whether `optimizer` clips its gradients (`clipnorm`, `global_clipnorm` or
    `clipvalue` set above 0), as `BaseOptimizer._clip_gradients` decides.

    Example:
        >>> import keras
        >>> clips(keras.optimizers.SGD(global_clipnorm=1.0)), clips(keras.optimizers.SGD())
        (True, False)
    """
    return any((value or 0) > 0 for value in
               (optimizer.clipnorm, optimizer.global_clipnorm, optimizer.clipvalue))


def _clips_after_all_reduce(optimizer, *args, **kwargs) -> bool:
    """Clipping, several replicas of a strategy of strategykit's, a replica context, no
    accumulation: where upstream clips each replica's gradient before the all-reduce."""
    context = tf.distribute.get_replica_context()
    return bool(clips(optimizer) and not optimizer.gradient_accumulation_steps
                and strategies.in_ours() and context is not None
                and context.num_replicas_in_sync > 1)


def _clip_gradients(self, grads):
    """Keras's clipping, or where the all-reduce comes later, none yet."""
    if _clips_after_all_reduce(self):
        return grads  # clipped in _backend_update_step, after the all-reduce
    return original(resolve(_TF_OPTIMIZER), "_clip_gradients")(self, grads)


def _backend_update_step(self, grads, trainable_variables, learning_rate):
    """Keras's update step, with the all-reduced gradients clipped before the update."""
    if not _clips_after_all_reduce(self):
        return original(resolve(_TF_OPTIMIZER), "_backend_update_step")(
            self, grads, trainable_variables, learning_rate)
    variables = [v.value if isinstance(v, keras.Variable) else v for v in trainable_variables]
    reduced = self._all_reduce_sum_gradients(list(zip(grads, variables)))
    clipped = original(resolve(_TF_OPTIMIZER), "_clip_gradients")(
        self, [grad for grad, _ in reduced])
    tf.__internal__.distribute.interim.maybe_merge_call(
        self._distributed_tf_update_step, self._distribution_strategy,
        list(zip(clipped, variables)), learning_rate)


_RELIES_ON = {
    # clips, applies weight decay, then calls _backend_update_step; the other branch
    # (accumulation) is strategykit.upstream.accumulation's
    f"{_BASE}._backend_apply_gradients": ("48d6e24d58039241",  # 3.10.0 to 3.15.1
                                         "90f49235e544f3f1"),  # 3.8.0 to 3.9.2
    f"{_BASE}._clip_gradients": "152b956e23c91ad9",  # replaced; called after the all-reduce
    # replaced: all-reduce, then maybe_merge_call(_distributed_tf_update_step)
    f"{_TF_OPTIMIZER}._backend_update_step": "00bd759c099a6b72",
    f"{_TF_OPTIMIZER}._all_reduce_sum_gradients": ("953512efa56c9680",  # 3.14.0 to 3.15.1
                                                   "dd8896fa68d79501"),  # 3.8.0 to 3.13.2
    f"{_TF_OPTIMIZER}._distributed_tf_update_step": "ec83c95231ba33ee",
}

FIXES = tuple(
    Fix(
        issue="keras-team/keras (unreported)",
        affects="gradient clipping (clipnorm, global_clipnorm, clipvalue) under several replicas",
        owner=_TF_OPTIMIZER,
        attribute=attribute,
        replacement=replacement,
        relies_on=_RELIES_ON,
        refuses_when=_clips_after_all_reduce,
    )
    for attribute, replacement in (("_clip_gradients", _clip_gradients),
                                   ("_backend_update_step", _backend_update_step))
)
