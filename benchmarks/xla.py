"""XLA on 4 replicas: `fit()` with `jit_compile=True` against `jit_compile=False`.

strategykit compiles each replica's step with XLA (`strategykit.upstream.xla_steps`);
Keras alone fails at the first step. 4 replicas (`sk.mirrored(replicas=4)`: 4 GPUs where
there are, simulated on the CPU here; the script runs unchanged on either), the 20-layer
conv net of `workloads`, Adam, global batch 64, `sk.shard` data of 20 steps:

- `xla_sync` vs `plain_sync`: step time with `sk.SyncBatchNormalization` after every
  convolution (each replica's step compiled in stretches between the all-reduces of the
  moments);
- `xla_nobn` vs `plain_nobn`: step time without batch norm (one compiled stretch per
  replica: forward, loss, backward);
- `xla_call` vs `plain_call`: the whole `fit(epochs=3)` call of the first pair, from the
  compiled model to the call's return (tracing and XLA's compilation included), per step.

With `--how interleaved`, each fresh process builds both models of a step pair and times
their `fit()` rounds alternately.

    python benchmarks/xla.py --pairs 5
"""

from __future__ import annotations

import time

import harness
import workloads

ROUNDS = 10


def _setup(xla: bool, synchronized: bool):
    import keras

    import strategykit as sk

    strategy = sk.mirrored(replicas=4)
    with strategy.scope():
        model = workloads.conv_net(
            batch_norm=sk.SyncBatchNormalization if synchronized else None)
        model.compile(keras.optimizers.Adam(1e-3), "sparse_categorical_crossentropy",
                      jit_compile=xla)
    data = workloads.labeled_images(workloads.GLOBAL_BATCH * workloads.STEPS)
    return model, sk.shard(data, strategy, global_batch_size=workloads.GLOBAL_BATCH)


def _step(xla: bool, synchronized: bool) -> float:
    model, data = _setup(xla, synchronized)
    return harness.fit_step_seconds(model, data, steps=workloads.STEPS, epochs=6)


def _whole_call(xla: bool) -> float:
    model, data = _setup(xla, synchronized=True)
    start = time.perf_counter()
    model.fit(data, epochs=3, verbose=0)
    return (time.perf_counter() - start) / (3 * workloads.STEPS)


def interleaved(order: list[str]) -> dict[str, list[float]]:
    """Both step variants of a pair in this process, their fit() rounds alternated."""
    def setup(variant):
        compiled, kind = variant.split("_")
        return _setup(compiled == "xla", kind == "sync")

    return harness.traced_and_alternated(order, setup, rounds=ROUNDS, steps=workloads.STEPS)


VARIANTS = {
    "xla_sync": lambda: _step(True, True),
    "plain_sync": lambda: _step(False, True),
    "xla_nobn": lambda: _step(True, False),
    "plain_nobn": lambda: _step(False, False),
    "xla_call": lambda: _whole_call(True),
    "plain_call": lambda: _whole_call(False),
}

STEP_COMPARISONS = [("xla_sync", "plain_sync"), ("xla_nobn", "plain_nobn")]

if __name__ == "__main__":
    harness.main(__file__, VARIANTS, [*STEP_COMPARISONS, ("xla_call", "plain_call")],
                 interleaved=interleaved, interleaved_comparisons=STEP_COMPARISONS)
