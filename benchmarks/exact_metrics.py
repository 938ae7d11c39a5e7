"""What exact metrics cost: `fit()` and `evaluate()` steps with strategykit's metric fix
(`strategykit/upstream/exact_metrics.py`) against the same steps without it (main before).

Workload: 4 simulated replicas, a 20-layer conv net on 8x8x8 inputs, global batch 64,
`compile(metrics=["accuracy"], weighted_metrics=["accuracy"])`, `sk.shard` data of 20
steps whose final batch is padded (1275 examples). The fix adds one all-reduce of two
counts per step, a mask of the batch and the loss tracker's correction. Target: median
ratio <= 1.03.

Measured two ways (see `harness`): each variant in its own fresh processes; and both
in each fresh process, interleaved (the fix is read when a step is traced: one model is
traced with it, the other without, then their rounds alternate).

    python benchmarks/exact_metrics.py --pairs 5
"""

from __future__ import annotations

import time

import harness
import workloads

ROUNDS = 12
EXAMPLES = workloads.GLOBAL_BATCH * workloads.STEPS - 5


def _setup(fixed: bool):
    import numpy as np

    import strategykit as sk
    from strategykit.upstream import exact_metrics

    strategy = sk.mirrored(replicas=4)
    for fix in exact_metrics.FIXES:
        fix.install() if fixed else fix.uninstall()
    with strategy.scope():
        model = workloads.conv_net()
        model.compile("sgd", "sparse_categorical_crossentropy", metrics=["accuracy"],
                      weighted_metrics=["accuracy"])
    rng = np.random.default_rng(0)
    x = rng.normal(size=(EXAMPLES, 8, 8, 8)).astype("float32")
    y = rng.integers(0, 10, size=EXAMPLES)
    data = sk.shard((x, y), strategy, global_batch_size=workloads.GLOBAL_BATCH)
    return model, data


def _evaluate_seconds(model, data) -> float:
    """Seconds per `evaluate()` step of one pass."""
    start = time.perf_counter()
    model.evaluate(data, verbose=0)
    return (time.perf_counter() - start) / workloads.STEPS


def _separate(kind: str, fixed: bool) -> float:
    model, data = _setup(fixed)
    if kind == "fit":
        return harness.fit_step_seconds(model, data, steps=workloads.STEPS, epochs=8)
    _evaluate_seconds(model, data)  # traces
    return min(_evaluate_seconds(model, data) for _ in range(8))


def _round(kind: str, model, data) -> float:
    if kind == "fit":
        return harness.fit_round_seconds(model, data, steps=workloads.STEPS)
    return _evaluate_seconds(model, data)


def interleaved(order: list[str]) -> dict[str, list[float]]:
    """Both variants in this process: each traced with or without the fix, then alternated."""
    from strategykit.upstream import exact_metrics

    setups = {}
    for variant in order:  # trace each with the fix as its name says
        setups[variant] = _setup(fixed=variant.startswith("exact"))
        _round(variant.split("_")[1], *setups[variant])
    for fix in exact_metrics.FIXES:
        fix.install()
    seconds = {variant: [] for variant in order}
    for _ in range(ROUNDS):
        for variant in order:
            seconds[variant].append(_round(variant.split("_")[1], *setups[variant]))
    return seconds


VARIANTS = {f"{fixed}_{kind}": (lambda kind=kind, fixed=fixed: _separate(kind, fixed == "exact"))
            for kind in ("fit", "evaluate") for fixed in ("exact", "main")}

if __name__ == "__main__":
    harness.main(__file__, VARIANTS, [("exact_fit", "main_fit"),
                                      ("exact_evaluate", "main_evaluate")],
                 interleaved=interleaved)
