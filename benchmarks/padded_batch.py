"""What telling the layers a step's real examples costs: `fit()` with it against main.

Every step function Keras builds publishes its batch (`strategykit.batches.current_step`):
synchronized batch norm then takes masked moments over the real examples (sk.shard's
padded copies left out), activity regularizers count the real examples. "main" is the
same code with the publication switched off (`current_step.publishing` returning the step
as it is): the moments unmasked, copies included, as before this change. 4 simulated
replicas, global batch 64, `sk.shard` data of 19 full steps and a final batch of 5
(padded), Adam:

- `marked_sync` vs `main_sync`: the 20-layer conv net of `workloads` with
  `sk.SyncBatchNormalization` after every convolution (the masked moments: target
  median ratio <= 1.02);
- `marked_plain` vs `main_plain`: the same net without batch norm (nothing reads the
  real examples but the exact loss and metrics, which did before);
- `marked_sync_call` vs `main_sync_call`: the whole `fit(epochs=3)` call of the first,
  traced and run until it returns, per step.

With `--how interleaved`, each fresh process builds both models of a step pair (the step
functions are made once, with and without the publication) and times their `fit()` rounds
alternately, which takes the machine's drift between processes out of the ratio.

    python benchmarks/padded_batch.py --pairs 5
"""

from __future__ import annotations

import contextlib
import time

import harness
import workloads

EXAMPLES = workloads.GLOBAL_BATCH * (workloads.STEPS - 1) + 5
ROUNDS = 12


@contextlib.contextmanager
def _publication(marked: bool):
    """Step functions made inside publish their batch (`marked`) or run as they are."""
    from strategykit.batches import current_step

    publishing = current_step.publishing
    if not marked:
        current_step.publishing = lambda step_function: step_function
    try:
        yield
    finally:
        current_step.publishing = publishing


def _setup(marked: bool, synchronized: bool):
    import keras

    import strategykit as sk

    strategy = sk.mirrored(replicas=4)
    with strategy.scope():
        model = workloads.conv_net(
            batch_norm=sk.SyncBatchNormalization if synchronized else None)
        model.compile(keras.optimizers.Adam(1e-3), "sparse_categorical_crossentropy")
    data = workloads.labeled_images(EXAMPLES)
    return model, sk.shard(data, strategy, global_batch_size=workloads.GLOBAL_BATCH)


def _step(marked: bool, synchronized: bool) -> float:
    with _publication(marked):
        model, data = _setup(marked, synchronized)
        return harness.fit_step_seconds(model, data, steps=workloads.STEPS, epochs=6)


def _whole_call(marked: bool) -> float:
    with _publication(marked):
        model, data = _setup(marked, synchronized=True)
        start = time.perf_counter()
        model.fit(data, epochs=3, verbose=0)
    return (time.perf_counter() - start) / (3 * workloads.STEPS)


def interleaved(order: list[str]) -> dict[str, list[float]]:
    """Both step variants of a pair in this process, their fit() rounds alternated."""
    def setup(variant):
        marked, kind = variant.split("_")[:2]
        with _publication(marked == "marked"):
            model, data = _setup(marked == "marked", kind == "sync")
            harness.fit_round_seconds(model, data, steps=workloads.STEPS)  # traced here
        return model, data

    return harness.traced_and_alternated(order, setup, rounds=ROUNDS, steps=workloads.STEPS)


VARIANTS = {
    "marked_sync": lambda: _step(True, True),
    "main_sync": lambda: _step(False, True),
    "marked_plain": lambda: _step(True, False),
    "main_plain": lambda: _step(False, False),
    "marked_sync_call": lambda: _whole_call(True),
    "main_sync_call": lambda: _whole_call(False),
}

STEP_COMPARISONS = [("marked_sync", "main_sync"), ("marked_plain", "main_plain")]

if __name__ == "__main__":
    harness.main(__file__, VARIANTS, [*STEP_COMPARISONS, ("marked_sync_call", "main_sync_call")],
                 interleaved=interleaved, interleaved_comparisons=STEP_COMPARISONS)
