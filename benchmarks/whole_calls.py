"""Whole Keras calls as users make them: one device, Keras + MirroredStrategy, strategykit.

Workload (the demo's): scikit-learn digits (1,347 train, 450 test, 8x8x1), three blocks of
3x3 Conv2D (16 channels, no bias) + BatchNormalization + ReLU, pooling, Dense(10) logits,
Adam, global batch 64, 21 training steps an epoch. Variants, each in a fresh process:
`one_device` (plain Keras and tf.data), `keras_distribute` (MirroredStrategy over 4 logical
CPUs as the Keras docs show, BatchNormalization(synchronized=True), the same tf.data
pipelines), `strategykit` (`sk.mirrored(replicas=4)`, `sk.shard`, `sk.convert_sync_batchnorm`,
`sk.callbacks.CrossReplicaLoss()`). Each process calls `fit(train, epochs=E,
validation_data=val)`, `evaluate(val)`, `predict(x)`, then three "notebook" `fit(...,
epochs=2)` on the same model. A callback stamps every hook with `time.perf_counter()`,
giving per call: step time (per step, also with `--steps-per-execution`), epoch start to
first step, last step to epoch end (validation included) and validation start to its first
step, epoch time (all medians over the epochs after the first), and the return delay, from
the last batch's end until the call returns (target: at most 0.5 s, every call).

The parent runs the variants round robin in fresh processes after an uncounted warm-up
and prints each figure's median over processes with min and max, and the median, min and
max of the rounds' ratios of the first fit's epoch time. `--count-collectives` instead
traces one training step of each variant (each in its own process, so strategykit's fixes
and two strategies never meet) and counts the collective ops its graph runs.

    python benchmarks/whole_calls.py --pairs 5
    python benchmarks/whole_calls.py --pairs 5 --steps-per-execution 4
    python benchmarks/whole_calls.py --count-collectives
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import time

import harness

VARIANTS = ("one_device", "keras_distribute", "strategykit")
REPLICAS = 4
BATCH = 64
HOOKS = [f"{what}_{when}" for what in ("train", "epoch", "test", "predict", "train_batch",
                                        "test_batch", "predict_batch") for when in ("begin", "end")]


def _setup(variant: str, steps_per_execution: int):
    """The variant's strategy, compiled model, and train, validation and predict inputs."""
    import tensorflow as tf

    if variant == "strategykit":
        import strategykit as sk

        strategy = sk.mirrored(replicas=REPLICAS)  # first: it splits the CPU
    elif variant == "keras_distribute":
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(REPLICAS)])
        strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(REPLICAS)])
    else:
        strategy = tf.distribute.get_strategy()
    import keras

    from strategykit.data.datasets import load_digits

    data = load_digits()
    keras.utils.set_random_seed(0)
    if variant == "strategykit":
        train = sk.shard((data.x_train, data.y_train), strategy, global_batch_size=BATCH,
                         shuffle=True, seed=0, drop_remainder=True)
        val = sk.shard((data.x_test, data.y_test), strategy, global_batch_size=BATCH)
        x_val = sk.shard(data.x_test, strategy, global_batch_size=BATCH, pad_remainder=False)
    else:
        train = (tf.data.Dataset.from_tensor_slices((data.x_train, data.y_train))
                 .shuffle(len(data.x_train), seed=0).batch(BATCH, drop_remainder=True))
        val = tf.data.Dataset.from_tensor_slices((data.x_test, data.y_test)).batch(BATCH)
        x_val = tf.data.Dataset.from_tensor_slices(data.x_test).batch(BATCH)
    with strategy.scope():
        inputs = keras.Input(data.image_shape)
        x = inputs
        for _ in range(3):
            x = keras.layers.Conv2D(16, 3, padding="same", use_bias=False)(x)
            x = keras.layers.BatchNormalization(synchronized=variant == "keras_distribute")(x)
            x = keras.layers.ReLU()(x)
        outputs = keras.layers.Dense(10)(keras.layers.GlobalAveragePooling2D()(x))
        model = keras.Model(inputs, outputs)
        if variant == "strategykit":
            model = sk.convert_sync_batchnorm(model)
        model.compile(optimizer=keras.optimizers.Adam(3e-3),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"], steps_per_execution=steps_per_execution)
    return strategy, model, train, val, x_val


def _timer():
    """A Keras callback that appends (hook, perf_counter, batch index) at every hook."""
    import keras

    def recorder(hook):
        def record(self, index=None, logs=None):
            self.events.append((hook, time.perf_counter(), index if "batch" in hook else None))
        return record

    timer = type("Timer", (keras.callbacks.Callback,), {f"on_{h}": recorder(h) for h in HOOKS})()
    timer.events = []
    return timer


def _steps(events, kind: str) -> list[float]:
    """Seconds per step of each `kind` batch (a batch of K steps counts K times less)."""
    seconds, begin = [], None
    for hook, t, index in events:
        if hook == f"{kind}_batch_begin":
            begin = (t, index)
        elif hook == f"{kind}_batch_end" and begin is not None:
            seconds.append((t - begin[0]) / (index - begin[1] + 1))
            begin = None
    return seconds


def _first(events, hook, last=False):
    return next((t for h, t, _ in (reversed(events) if last else events) if h == hook), None)


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _figures(call: str, events, started: float, returned: float) -> dict:
    """The figures of one call from its callback stamps."""
    kind = {"fit": "train", "evaluate": "test", "predict": "predict"}[call.split()[0]]
    batch_ends = [t for h, t, _ in events if h.endswith("batch_end")]
    out = {"call": call, "wall": returned - started, "step": _median(_steps(events, kind)),
           "return": returned - batch_ends[-1]}
    if kind != "train":
        start = _first(events, f"{kind}_begin")
        out["before_first"] = _first(events, f"{kind}_batch_begin") - start
        return out
    begins = [i for i, (h, _, _) in enumerate(events) if h == "epoch_begin"]
    ends = [i for i, (h, _, _) in enumerate(events) if h == "epoch_end"]
    epochs = [events[i:j + 1] for i, j in zip(begins, ends)]
    per_epoch = []
    for e in epochs:
        test_begin = _first(e, "test_begin")
        per_epoch.append({
            "epoch": e[-1][1] - e[0][1],
            "before_first": _first(e, "train_batch_begin") - e[0][1],
            "after_last": e[-1][1] - _first(e, "train_batch_end", last=True),
            "val_before_first": test_begin and _first(e, "test_batch_begin") - test_begin,
            "steps": sum(i - j + 1 for (h, _, i), (_, _, j) in zip(e[1:], e)
                         if h == "train_batch_end"),
        })
    later = per_epoch[1:] or per_epoch
    for key in ("epoch", "before_first", "after_last", "val_before_first"):
        out[key] = _median(p[key] for p in later)
    out["first_epoch"] = per_epoch[0]["epoch"]
    out["steps_per_epoch"] = per_epoch[-1]["steps"]
    return out


def run_calls(variant: str, epochs: int, steps_per_execution: int) -> dict:
    """In this process: the figures of every call of the variant."""
    import strategykit as sk

    _, model, train, val, x_val = _setup(variant, steps_per_execution)
    extra = [sk.callbacks.CrossReplicaLoss()] if variant == "strategykit" else []
    plan = [("fit 1", lambda cb: model.fit(train, epochs=epochs, validation_data=val,
                                            verbose=0, callbacks=[*extra, cb])),
            ("evaluate", lambda cb: model.evaluate(val, verbose=0, callbacks=[cb])),
            ("predict", lambda cb: model.predict(x_val, verbose=0, callbacks=[cb]))]
    plan += [(f"fit {n}", lambda cb: model.fit(train, epochs=2, validation_data=val, verbose=0,
                                               callbacks=[*extra, cb])) for n in (2, 3, 4)]
    calls = []
    for name, call in plan:
        timer = _timer()
        started = time.perf_counter()
        call(timer)
        calls.append(_figures(name, timer.events, started, time.perf_counter()))
    return {"variant": variant, "calls": calls}


def _traced_step(train_function):
    """Keras's tf.function `multi_step_on_iterator` among the closures of `train_function`
    (a Python wrapper, itself maybe wrapped by strategykit's fixes)."""
    seen, todo = set(), [train_function]
    while todo:
        item = todo.pop()
        function = getattr(item, "python_function", item)  # a tf.function's own
        if id(item) in seen or not hasattr(function, "__code__"):
            continue
        seen.add(id(item))
        if function.__name__ == "multi_step_on_iterator" and hasattr(item, "python_function"):
            return item
        todo += [cell.cell_contents for cell in function.__closure__ or ()
                 if callable(cell.cell_contents)]
    raise RuntimeError("Keras's multi_step_on_iterator not found in train_function")


def count_collectives(variant: str) -> dict[str, int]:
    """In this process: collective ops of one traced training step, by op type."""
    strategy, model, train, _, _ = _setup(variant, 1)
    if variant == "keras_distribute":
        train = strategy.experimental_distribute_dataset(train)  # what fit() does
    model.make_train_function()
    graph_def = _traced_step(model.train_function).get_concrete_function(
        iter(train)).graph.as_graph_def()
    library = {f.signature.name: f for f in graph_def.library.function}

    def count(nodes) -> collections.Counter:
        """Collectives a run of `nodes` executes: calls and loop bodies counted once each,
        of a conditional's branches the one with most (tf.function's first-call `cond`
        between the variable-creating trace and the other is such a conditional)."""
        counts = collections.Counter()
        for node in nodes:
            if node.op.startswith(("Collective", "NcclAllReduce")):
                counts[node.op] += 1
            branches = []
            for key, value in node.attr.items():  # f of calls, body/cond of loops, branches
                for name in [value.func.name, *(f.name for f in value.list.func)]:
                    if name in library:
                        inner = count(library[name].node_def)
                        if key in ("then_branch", "else_branch", "branches"):
                            branches.append(inner)
                        else:
                            counts += inner
            counts += max(branches, key=lambda c: c.total(), default=collections.Counter())
        return counts

    return dict(count(graph_def.node))


def _cell(values) -> str:
    if not (values := [v * 1e3 for v in values if v is not None]):
        return f"{'-':>27}"
    return f"{statistics.median(values):8.1f} [{min(values):7.1f}, {max(values):7.1f}]"


ROWS = [  # (label, figure of one process's calls)
    ("fit 1: whole call", lambda c: c[0]["wall"]),
    ("fit 1: epoch (median after the 1st)", lambda c: c[0]["epoch"]),
    ("fit 1: first epoch", lambda c: c[0]["first_epoch"]),
    ("fit 1: step", lambda c: c[0]["step"]),
    ("fit 1: epoch start -> first step", lambda c: c[0]["before_first"]),
    ("fit 1: last step -> epoch end (w/ val)", lambda c: c[0]["after_last"]),
    ("fit 1: validation start -> 1st step", lambda c: c[0]["val_before_first"]),
    ("fit 1: return delay", lambda c: c[0]["return"]),
    ("evaluate: step", lambda c: c[1]["step"]),
    ("evaluate: start -> first step", lambda c: c[1]["before_first"]),
    ("evaluate: return delay", lambda c: c[1]["return"]),
    ("predict: step", lambda c: c[2]["step"]),
    ("predict: start -> first step", lambda c: c[2]["before_first"]),
    ("predict: return delay", lambda c: c[2]["return"]),
    ("fits 2-4: first epoch (median)", lambda c: _median(x["first_epoch"] for x in c[3:])),
    ("fits 2-4: second epoch (median)", lambda c: _median(x["epoch"] for x in c[3:])),
    ("fits 2-4: return delay (max)", lambda c: max(x["return"] for x in c[3:])),
    ("return delay, worst call", lambda c: max(x["return"] for x in c)),
]


def _child(arguments: list[str]):
    """A fresh process's JSON, or None when it failed (its last error line is printed)."""
    try:
        return harness._run_child(__file__, arguments)
    except RuntimeError as error:
        lines = [x.strip() for x in str(error).splitlines()]
        lines = ([x for x in lines if x.startswith("(0)")]  # TensorFlow's first root error
                 or [x for x in lines if "rror" in x] or ["?"])
        print(f"  {' '.join(arguments)} FAILED: {lines[-1][:200]}")
        return None


def compare(pairs: int, extra: list[str]) -> None:
    """Runs the variants round robin in fresh processes and prints the table."""
    _child(["--variant", VARIANTS[0], *extra])  # warm-up, not counted
    runs = {v: [] for v in VARIANTS}
    for round_ in range(pairs):
        for variant in VARIANTS:
            runs[variant].append(_child(["--variant", variant, *extra]))
        print(f"round {round_ + 1}/{pairs}: fit 1 epoch " + ", ".join(
            f"{v} {r[-1]['calls'][0]['epoch'] * 1e3:.0f} ms" if r[-1] else f"{v} failed"
            for v, r in runs.items()), flush=True)
    ok = {v: [r for r in runs[v] if r] for v in VARIANTS}
    counted = ", ".join(f"{v} {len(r)}" for v, r in ok.items())
    steps = ", ".join(str(r[0]["calls"][0]["steps_per_epoch"]) if r else "-" for r in ok.values())
    print(f"\nmilliseconds, median [min, max] over processes ({counted}); steps per epoch, "
          f"as Keras's batch indices count them: {steps}")
    print(f"{'figure':<40}" + "".join(f"{v:>29}" for v in VARIANTS))
    for label, figure in ROWS:
        print(f"{label:<40}" + "".join(
            f"  {_cell([figure(r['calls']) for r in ok[v]])}" for v in VARIANTS))
    print()
    for variant in VARIANTS:  # the target is strategykit's; the others show what it fixes
        calls = [(c["return"], c["call"], i + 1) for i, r in enumerate(runs[variant]) if r
                 for c in r["calls"]]
        if not calls:
            continue
        worst = max(calls)
        target = (f"; target every call <= 0.5 s: {'met' if worst[0] <= 0.5 else 'MISSED'}"
                  f"{' (in the processes that ran)' if len(ok[variant]) < pairs else ''}"
                  if variant == "strategykit" else "")
        print(f"worst return delay, {variant}: {worst[0]:.3f} s ({worst[1]}, process "
              f"{worst[2]}){target}")
    print(f"\n{'ratio of fit 1 epoch time':<40} {'median':>7} {'min':>7} {'max':>7} rounds")
    for b in ("keras_distribute", "one_device"):
        ratios = [s["calls"][0]["epoch"] / o["calls"][0]["epoch"]
                  for s, o in zip(runs["strategykit"], runs[b]) if s and o]
        if ratios:
            print(f"{'strategykit / ' + b:<40} {statistics.median(ratios):7.3f} "
                  f"{min(ratios):7.3f} {max(ratios):7.3f} {len(ratios):6d}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=VARIANTS)
    parser.add_argument("--pairs", type=int, default=5, help="rounds of the three variants")
    parser.add_argument("--epochs", type=int, default=6, help="epochs of the first fit()")
    parser.add_argument("--steps-per-execution", type=int, default=1)
    parser.add_argument("--count-collectives", action="store_true",
                        help="count the collective ops of one traced training step")
    args = parser.parse_args()
    if args.count_collectives and args.variant:
        print(json.dumps(count_collectives(args.variant)))
    elif args.count_collectives:
        print(f"{'variant':<20} {'collectives per step':>20} {'per replica':>12}  by op type")
        for variant in VARIANTS:
            if (counts := _child(["--count-collectives", "--variant", variant])) is None:
                continue
            total = sum(counts.values())
            print(f"{variant:<20} {total:20d} {total / REPLICAS:12.1f}  "
                  f"{', '.join(f'{k} {n}' for k, n in sorted(counts.items())) or '-'}")
    elif args.variant:
        print(json.dumps(run_calls(args.variant, args.epochs, args.steps_per_execution)))
    else:
        compare(args.pairs, ["--epochs", str(args.epochs),
                             "--steps-per-execution", str(args.steps_per_execution)])


if __name__ == "__main__":
    main()
