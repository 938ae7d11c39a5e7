"""What gradient accumulation costs under a strategy: K=4 against K=1, and how it reduces.

Workload: 4 simulated replicas (`sk.mirrored(replicas=4)`), the 20-layer conv net on
8x8x8 inputs, global micro-batch 64 (16 per replica), SGD with momentum, `fit()` step
time per micro-batch (20 micro-steps per epoch, a multiple of K). Variants:

* `k4`: `gradient_accumulation_steps=4` as strategykit does it: every replica
  accumulates its own gradients, one all-reduce per update (every 4 micro-steps);
* `k4_every_step`: the same with the gradients all-reduced at every micro-step (the
  alternative strategykit measured and did not choose);
* `k1`: no accumulation (one all-reduce and one update per micro-step).

It also prints the all-reduces per K micro-steps, counted in the traced graph of one
`strategy.run(model.train_step)`: the collective all-reduce ops (one per replica for
each packed all-reduce) outside the optimizer's cond run every micro-step, those inside
its update branch once per K.

    python benchmarks/accumulation.py --pairs 5
"""

from __future__ import annotations

import harness
import workloads

REPLICAS = 4
K = 4
ROUNDS = 8
VARIANTS = ("k4", "k4_every_step", "k1")


def _model(strategy, variant: str):
    import keras

    from strategykit import upstream

    upstream.accumulation._REDUCE_EVERY_MICRO_STEP = variant == "k4_every_step"
    with strategy.scope():
        model = workloads.conv_net()
        steps = None if variant == "k1" else K
        optimizer = keras.optimizers.SGD(0.01, momentum=0.9, gradient_accumulation_steps=steps)
        model.compile(optimizer, "sparse_categorical_crossentropy")
    return model


def _step_seconds(variant: str) -> float:
    import strategykit as sk

    model = _model(sk.mirrored(replicas=REPLICAS), variant)
    return harness.fit_step_seconds(model, workloads.random_images(), steps=workloads.STEPS,
                                    epochs=6)


def interleaved(order: list[str]) -> dict[str, list[float]]:
    """The variants in this process, one `fit()` round each in `order`, `ROUNDS` times.

    The reduction switch is read when a step is traced, and every model is traced in
    round 0 with its own setting, so the models can share the process.
    """
    import strategykit as sk

    strategy = sk.mirrored(replicas=REPLICAS)
    data = workloads.random_images()
    models, seconds = {}, {variant: [] for variant in order}
    for round_ in range(ROUNDS + 1):  # round 0 traces
        for variant in order:
            if variant not in models:
                models[variant] = _model(strategy, variant)
            step = harness.fit_round_seconds(models[variant], data, steps=workloads.STEPS)
            if round_:
                seconds[variant].append(step)
    return seconds


def all_reduces_per_k_steps(variant: str) -> int:
    """All-reduces per K micro-steps, counted in the traced graph of one training step."""
    import tensorflow as tf

    import strategykit as sk

    strategy = sk.mirrored(replicas=REPLICAS)
    model = _model(strategy, variant)
    with strategy.scope():
        model.optimizer.build(model.trainable_variables)
    batches = strategy.experimental_distribute_dataset(workloads.random_images(batches=1))
    step = tf.function(lambda batch: strategy.run(model.train_step, args=(batch,)))
    graph = step.get_concrete_function(next(iter(batches))).graph.as_graph_def()
    functions = {f.signature.name: f.node_def for f in graph.library.function}

    def collectives(nodes) -> int:
        return sum(node.op.startswith(("CollectiveReduce", "NcclAllReduce")) for node in nodes)

    update_branches = {node.attr["then_branch"].func.name for node in graph.node
                       if node.op in ("If", "StatelessIf")}
    every_step = collectives(graph.node)
    once = sum(collectives(functions[name]) for name in update_branches)
    return (every_step * K + once) // REPLICAS


def _variant(name: str):
    return lambda: _step_seconds(name)


if __name__ == "__main__":
    import json
    import sys

    if "--count" in sys.argv:
        print(json.dumps({"count": all_reduces_per_k_steps(sys.argv[-1])}))
        sys.exit()
    if "--variant" not in sys.argv and "--interleaved" not in sys.argv:
        for name in VARIANTS:
            count = harness._run_child(__file__, ["--count", name])["count"]
            print(f"{name:<14} all-reduces per {K} micro-steps: {count}", flush=True)
    harness.main(__file__, {name: _variant(name) for name in VARIANTS},
                 [("k4", "k1"), ("k4_every_step", "k4")], interleaved=interleaved)
