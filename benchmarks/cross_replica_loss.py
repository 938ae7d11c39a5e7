"""What `CrossReplicaLoss` costs: `fit()` with it against plain `fit()`, same strategy.

Workload: 4 simulated replicas, a 20-layer conv net on 8x8x8 inputs, global batch 64,
`fit()` step time, fastest of 8 epochs per process. The callback runs with its
defaults: every replica's loss and four reductions per batch, the NaN guard with its
weight snapshot in every step, the weight check and drift measurement at every epoch
end. Target: median ratio <= 1.03.

    python benchmarks/cross_replica_loss.py --pairs 5
"""

from __future__ import annotations

import harness
import workloads


class _FitWithCallbacks:
    """Hands `harness.fit_step_seconds` a model whose `fit()` also runs `callbacks`."""

    def __init__(self, model, callbacks):
        self.model, self.callbacks = model, callbacks

    def fit(self, *args, callbacks=(), **kwargs):
        # Ours first, the harness's timer last: the timed epoch includes our work.
        return self.model.fit(*args, callbacks=[*self.callbacks, *callbacks], **kwargs)


def _step_seconds(with_callback: bool) -> float:
    import strategykit as sk
    from strategykit.callbacks import CrossReplicaLoss

    strategy = sk.mirrored(replicas=4)
    with strategy.scope():
        model = workloads.conv_net()
        model.compile("sgd", "sparse_categorical_crossentropy")
    callbacks = [CrossReplicaLoss()] if with_callback else []
    # 8 timed epochs (not 4): the ratio sought is small, so keep the fastest of more.
    return harness.fit_step_seconds(_FitWithCallbacks(model, callbacks),
                                    workloads.random_images(), steps=workloads.STEPS, epochs=8)


def cross_replica_loss() -> float:
    return _step_seconds(True)


def plain() -> float:
    return _step_seconds(False)


if __name__ == "__main__":
    harness.main(__file__, {"cross_replica_loss": cross_replica_loss, "plain": plain},
                 [("cross_replica_loss", "plain")])
