"""keras-team/keras#20164: an optimizer built in its first step under a strategy.

A custom `train_step` with optimizers of its own (the keras.io GAN: `compile(d_optimizer,
g_optimizer, loss_fn)`, then `self.d_optimizer.apply_gradients(...)`) leaves them unbuilt
until their first `apply_gradients`, inside the traced step, in the replica context.
Keras's `BaseOptimizer.apply` then builds the optimizer there (`self.build(variables)`),
and its slot variables are created inside the `tf.function`: under `MirroredStrategy`
(strategykit's or plain `tf.distribute`'s, on 2.18 to 2.21) the step then fails with
`You must feed a value for placeholder tensor 'cond/Placeholder_1'`, the slots' initial
values being captured from the graph. Keras compiles its own optimizer eagerly in
`fit()` (`_symbolic_build`), so only optimizers it does not know are affected.

The fix lifts the creation of an optimizer's variables out of the traced step, with
`tf.init_scope()`, where it happens in a replica context inside a function: the
variables are created once, eagerly, by the strategy's variable creator (mirrored on
every replica, as when the user calls `optimizer.build(model.trainable_variables)` in
`strategy.scope()`, the known workaround). Keras 2's optimizers did the same. It
replaces `BaseOptimizer.add_variable`, which every optimizer's `build` (and
`add_variable_from_reference`, `add_optimizer_variables`, `LossScaleOptimizer`) creates
its variables through; everywhere else it hands over to Keras's own. Checked on Keras
3.8.0 to 3.15.1: `add_variable` gained `layout=` in 3.10 and `apply` reordered its
empty-gradient filter in 3.10; the lazy build both rely on is the same in each.
"""

from __future__ import annotations

import tensorflow as tf

from strategykit.made import strategies
from strategykit.pinning.fix import Fix, original, resolve

_BASE_OPTIMIZER = "keras.src.optimizers.base_optimizer:BaseOptimizer"


def _in_a_traced_replica_step(*args, **kwargs) -> bool:
    """Inside a `tf.function`, in the replica context of a strategy strategykit made or
    sharded for: where variables created in the step fail (and fail under any other
    strategy, as upstream)."""
    return (tf.inside_function() and strategies.in_ours()
            and not tf.distribute.in_cross_replica_context())


def _add_variable(optimizer, *args, **kwargs):
    """Keras's `add_variable`, lifted out of a traced replica step with `tf.init_scope`."""
    add_variable = original(resolve(_BASE_OPTIMIZER), "add_variable")
    if not _in_a_traced_replica_step():
        return add_variable(optimizer, *args, **kwargs)
    with tf.init_scope():  # eager, still under the strategy's variable creator
        return add_variable(optimizer, *args, **kwargs)


FIXES = (
    Fix(
        issue="keras-team/keras#20164",
        affects=("an optimizer first built in a custom train_step under a strategy "
                 "(build it first: optimizer.build(model.trainable_variables) inside "
                 "strategy.scope())"),
        owner=_BASE_OPTIMIZER,
        attribute="add_variable",
        replacement=_add_variable,
        relies_on={
            # replaced; Keras 3.10 added layout=, passed through
            f"{_BASE_OPTIMIZER}.add_variable": ("2b3a7fd5d1ddc0d0",  # 3.8.0 to 3.9.2
                                                "ebca0dd1fd1704bf"),  # 3.10.0 to 3.15.1
            # builds the optimizer in its first apply, in the step: the same in each
            f"{_BASE_OPTIMIZER}.apply": ("95ecde5a8bba76af",  # 3.8.0 to 3.9.2
                                         "43097be63b919d03"),  # 3.10.0 to 3.15.1
            # wraps add_variable in colocate_vars_with (a no-op under MirroredStrategy)
            "keras.src.backend.tensorflow.optimizer:TFOptimizer.add_variable_from_reference":
                "fa3499082002f562",
        },
        refuses_when=lambda optimizer, *args, **kwargs: _in_a_traced_replica_step(),
    ),
)
