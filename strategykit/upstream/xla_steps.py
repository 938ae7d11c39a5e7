"""keras-team/keras#19005: `jit_compile="auto"` under a strategy of several replicas.

Keras compiles its whole step with XLA, `strategy.run` included, which fails on several
replicas (a replica's variable reached from the first device), so `"auto"` turns XLA
off under every strategy while one GPU gets it. strategykit compiles each replica's
step instead (`strategykit.xla.replica_steps`, used by `steps_per_execution`'s and
`exact_predictions`' fixes), and this fix of `Trainer._resolve_auto_jit_compile` decides
`"auto"` under several replicas as Keras does for one device: on with a GPU where every
layer supports XLA, off without a GPU. Checked on Keras 3.8.0 to 3.15.1.
"""

from __future__ import annotations

from strategykit.made import strategies
from strategykit.pinning.fix import Fix, original, resolve
from strategykit.xla.replica_steps import has_accelerator

ISSUE = "keras-team/keras#19005"
_TRAINER = "keras.src.trainers.trainer:Trainer"


def _resolve_auto_jit_compile(self):
    strategy = self.distribute_strategy
    if not strategies.is_ours(strategy) or strategy.num_replicas_in_sync == 1:
        return original(resolve(_TRAINER), "_resolve_auto_jit_compile")(self)
    if not has_accelerator():
        return False  # Keras's choice for one device too: no XLA on CPU-only machines
    return bool(resolve("keras.src.trainers.trainer:model_supports_jit")(self))


KERAS_RESOLVE_AUTO_JIT = "5de040d68326b8d4"
"""Fingerprints of Keras's `Trainer._resolve_auto_jit_compile`: 3.8.0 to 3.15.1."""

FIXES = (
    Fix(
        issue=ISSUE,
        affects='jit_compile="auto" under several replicas',
        owner=_TRAINER,
        attribute="_resolve_auto_jit_compile",
        replacement=_resolve_auto_jit_compile,
        relies_on={
            f"{_TRAINER}._resolve_auto_jit_compile": KERAS_RESOLVE_AUTO_JIT,
            "keras.src.trainers.trainer:model_supports_jit": "287a9d3336efcce3",
        },
    ),
)
