"""What `CrossReplicaLoss` costs: `fit()` with it against plain `fit()`, same strategy.

Workload: 4 simulated replicas, a 20-layer conv net on 8x8x8 inputs, global batch 64,
`fit()` step time. The callback runs with its defaults: every replica's loss and four
reductions per batch, the NaN guard with its weight snapshot in every step, the weight
check and drift measurement at every epoch end (20 steps). Target: median ratio <= 1.03.

Measured two ways (see `harness`): each variant in its own fresh processes, fastest of
8 epochs after a warm-up; and both in each fresh process, interleaved: 12 rounds of
`fit()` of each model in turn (a new callback every round, as in a notebook; the
callback keeps its traced steps with the model, so no round traces), each round's
second epoch timed. The interleaved ratio resolves a few percent on a noisy machine.

    python benchmarks/cross_replica_loss.py --pairs 5
"""

from __future__ import annotations

import harness
import workloads

ROUNDS = 12


class _FitWithCallbacks:
    """Hands `harness.fit_step_seconds` a model whose `fit()` also runs `callbacks`."""

    def __init__(self, model, callbacks):
        self.model, self.callbacks = model, callbacks

    def fit(self, *args, callbacks=(), **kwargs):
        # Ours first, the harness's timer last: the timed epoch includes our work.
        return self.model.fit(*args, callbacks=[*self.callbacks, *callbacks], **kwargs)


def _model(strategy):
    with strategy.scope():
        model = workloads.conv_net()
        model.compile("sgd", "sparse_categorical_crossentropy")
    return model


def _callbacks(variant: str) -> list:
    from strategykit.callbacks import CrossReplicaLoss

    return [CrossReplicaLoss()] if variant == "cross_replica_loss" else []


def _step_seconds(variant: str) -> float:
    import strategykit as sk

    model = _model(sk.mirrored(replicas=4))
    # 8 timed epochs (not 4): the ratio sought is small, so keep the fastest of more.
    return harness.fit_step_seconds(_FitWithCallbacks(model, _callbacks(variant)),
                                    workloads.random_images(), steps=workloads.STEPS, epochs=8)


def interleaved(order: list[str]) -> dict[str, list[float]]:
    """Both variants in this process, one `fit()` round each in `order`, `ROUNDS` times."""
    import strategykit as sk

    strategy = sk.mirrored(replicas=4)
    models = {variant: _model(strategy) for variant in order}
    data = workloads.random_images()
    seconds = {variant: [] for variant in order}
    for round_ in range(ROUNDS + 1):  # round 0 traces
        for variant in order:
            step = harness.fit_round_seconds(models[variant], data, steps=workloads.STEPS,
                                             callbacks=_callbacks(variant))
            if round_:
                seconds[variant].append(step)
    return seconds


def cross_replica_loss() -> float:
    return _step_seconds("cross_replica_loss")


def plain() -> float:
    return _step_seconds("plain")


if __name__ == "__main__":
    harness.main(__file__, {"cross_replica_loss": cross_replica_loss, "plain": plain},
                 [("cross_replica_loss", "plain")], interleaved=interleaved)
