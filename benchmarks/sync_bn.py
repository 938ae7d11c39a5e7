"""What synchronized batch norm costs: sk.SyncBatchNormalization, Keras synchronized=True, plain BN.

Workload: 4 simulated replicas (`sk.mirrored(replicas=4)`), a conv net with 20 batch
norm layers on 8x8x8 activations, global batch 64, `fit()` step time. The activations
are small, so the per-layer synchronization is a visible share of the step.

    python benchmarks/sync_bn.py --pairs 5
"""

from __future__ import annotations

import harness
import workloads

REPLICAS = 4


def _step_seconds(batch_norm) -> float:
    import strategykit as sk

    return workloads.fit_step_seconds_of(sk.mirrored(replicas=REPLICAS), batch_norm=batch_norm)


def sk_sync() -> float:
    import strategykit as sk

    return _step_seconds(sk.SyncBatchNormalization)


def keras_sync() -> float:
    import keras

    return _step_seconds(lambda: keras.layers.BatchNormalization(synchronized=True))


def plain() -> float:
    import keras

    return _step_seconds(keras.layers.BatchNormalization)


if __name__ == "__main__":
    harness.main(
        __file__,
        {"sk_sync": sk_sync, "keras_sync": keras_sync, "plain": plain},
        [("sk_sync", "keras_sync"), ("sk_sync", "plain")],
    )
