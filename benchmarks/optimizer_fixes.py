"""What the clipping and sparse-gradient fixes cost: `fit()` steps with them against main.

`strategykit/upstream/gradient_clipping.py` and `sparse_gradients.py` decide when a step
is traced: a model without clipping and without sparse gradients gets Keras's own code,
and with clipping the gradients are all-reduced once, as without. Two comparisons on 4
simulated replicas, global batch 64, `sk.shard` data of 20 steps, Adam:

- `fixed_plain` vs `main_plain`: the 20-layer conv net of `workloads`, no clipping (the
  fixes must cost nothing; target: median ratio <= 1.02);
- `fixed_clipped` vs `main_clipped`: the same with `global_clipnorm=1.0` (main clips
  each replica's gradient, the fix clips their sum: one clipping instead of four).

Measured two ways (see `harness`): each variant in its own fresh processes, and both in
each fresh process, interleaved (the fixes are read when a step is traced).

    python benchmarks/optimizer_fixes.py --pairs 5
"""

from __future__ import annotations

import harness
import workloads

ROUNDS = 12


def _fixes():
    from strategykit.upstream import gradient_clipping, sparse_gradients

    return (*gradient_clipping.FIXES, *sparse_gradients.FIXES)


def _setup(fixed: bool, clipped: bool):
    import keras

    import strategykit as sk

    strategy = sk.mirrored(replicas=4)
    for fix in _fixes():
        fix.install() if fixed else fix.uninstall()
    with strategy.scope():
        model = workloads.conv_net()
        optimizer = keras.optimizers.Adam(1e-3, global_clipnorm=1.0 if clipped else None)
        model.compile(optimizer, "sparse_categorical_crossentropy")
    data = workloads.labeled_images(workloads.GLOBAL_BATCH * workloads.STEPS)
    return model, sk.shard(data, strategy, global_batch_size=workloads.GLOBAL_BATCH)


def _separate(fixed: bool, clipped: bool) -> float:
    model, data = _setup(fixed, clipped)
    return harness.fit_step_seconds(model, data, steps=workloads.STEPS, epochs=8)


def interleaved(order: list[str]) -> dict[str, list[float]]:
    """Both variants in this process: each traced with or without the fixes, alternated."""
    setups = {}
    for variant in order:
        fixed, kind = variant.split("_")
        setups[variant] = _setup(fixed == "fixed", kind == "clipped")
        harness.fit_round_seconds(*setups[variant], steps=workloads.STEPS)  # traces
    for fix in _fixes():
        fix.install()
    return harness.alternated_rounds(setups, order, rounds=ROUNDS, steps=workloads.STEPS)


VARIANTS = {f"{fixed}_{kind}": (lambda fixed=fixed, kind=kind:
                                _separate(fixed == "fixed", kind == "clipped"))
            for kind in ("plain", "clipped") for fixed in ("fixed", "main")}

if __name__ == "__main__":
    harness.main(__file__, VARIANTS, [("fixed_plain", "main_plain"),
                                      ("fixed_clipped", "main_clipped")],
                 interleaved=interleaved)
