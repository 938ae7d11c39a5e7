"""Keras `fit()` on 2 worker processes against 1 process of 2 replicas, and where the time goes.

Workload: the 20-layer conv net of `workloads.conv_net` on 8x8x8 inputs, SGD, 32
examples per replica, `fit()` on data from `sk.shard` (20 steps per epoch). Variants,
each started afresh for every measurement:

* `multi_worker`: 2 worker processes x 1 replica, `sk.from_env()` with a `TF_CONFIG` on
  two free loopback ports (`MultiWorkerMirroredStrategy`), global batch 64. Every step
  all-reduces the gradients over gRPC, and Keras reduces the step's logs (the loss)
  across the workers too.
* `one_process`: 1 process x 2 simulated replicas, `sk.mirrored(replicas=2)` (logical CPU
  devices), global batch 64: the same work and the same all-reduce, inside one process.
* `two_alone`: 2 processes started together, each `sk.mirrored(["/cpu:0"])` with a
  batch of 32, training on its own: the multi-worker job's compute (two processes, two
  TensorFlow runtimes competing for the 2 cores) without any collective between them.

The step time is measured in process 0 (worker 0, the chief): one warm-up epoch (it
traces), then the wall time of each of `--epochs` epochs (`strategykit.cli.timing.
EpochTimer`); the fastest epoch divided by its steps, since interference only adds time.
In `two_alone` both processes wait for each other after the warm-up epoch, and each
keeps training until both have finished their timed epochs, so every timed epoch runs
while the other process computes as well. The variants run in turn, in fresh processes,
one round after a warm-up round (not counted), the order reversed every other round.
Every process runs in its own process group; when a variant is not done after
`--timeout` seconds, or one of its processes fails, every group of that variant is
killed (a worker whose peer died would wait in its collective forever).

The table gives, per round, the ratios of step times with their median, min and max:

* `multi_worker / one_process`: the goal, <= 1.5 on loopback.
* `two_alone / one_process`: (a) what splitting the same compute over two processes
  costs on this machine (two runtimes, each with thread pools sized for both cores).
* `multi_worker / two_alone`: (b) what the cross-worker collectives add on top: the
  gRPC all-reduce of the gradients and of the logs, and waiting for the slower worker.

Within a round (a) x (b) is exactly the first ratio. Below it come the median step
times per variant in ms, and the median per-round difference `multi_worker - two_alone`,
the collectives' time per step. A CPU-only 2-core machine says nothing about GPUs or
real networks: it measures the overhead of going multi-worker, not a speed-up.

    python benchmarks/multi_worker.py --pairs 5
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import harness
import workloads

from strategykit.launcher.launch import signal_groups

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

VARIANTS = ("multi_worker", "one_process", "two_alone")
PROCESSES = {"multi_worker": 2, "one_process": 1, "two_alone": 2}
COMPARISONS = [("multi_worker", "one_process"), ("two_alone", "one_process"),
               ("multi_worker", "two_alone")]
PER_REPLICA_BATCH = 32
STEPS = workloads.STEPS
EPOCHS = 8
TIMEOUT_SECONDS = 240.0
GOAL = 1.5
_BARRIER_SECONDS = 120.0  # the longest a `two_alone` process waits for the other


# ---- inside one process of a variant --------------------------------------------------

def _strategy(variant: str):
    import tensorflow as tf

    import strategykit as sk

    if variant == "multi_worker":
        strategy = sk.from_env()
        if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
            raise RuntimeError(f"expected a MultiWorkerMirroredStrategy, got {strategy!r}")
    elif variant == "one_process":
        strategy = sk.mirrored(replicas=2)
    else:
        strategy = sk.mirrored(["/cpu:0"])
    return strategy


def _wait_for(directory: str, name: str, processes: int) -> None:
    """Marks `name` done for this process; waits until every process has."""
    deadline = time.monotonic() + _BARRIER_SECONDS
    while len([f for f in os.listdir(directory) if f.startswith(name)]) < processes:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the other process did not reach {name!r} in time")
        time.sleep(0.01)


def _mark(directory: str, name: str, rank: int) -> None:
    with open(os.path.join(directory, f"{name}-{rank}"), "w"):
        pass


def _child(variant: str, rank: int, barrier: str, epochs: int) -> dict:
    import numpy as np

    import strategykit as sk
    from strategykit.cli.timing import EpochTimer

    strategy = _strategy(variant)
    replicas = strategy.num_replicas_in_sync
    global_batch = PER_REPLICA_BATCH * replicas
    rng = np.random.default_rng(0)  # the same data on every worker; sk.shard splits it
    x = rng.normal(size=(global_batch * STEPS, 8, 8, 8)).astype("float32")
    y = rng.integers(0, 10, size=len(x)).astype("int32")
    data = sk.shard((x, y), strategy, global_batch_size=global_batch)
    with strategy.scope():
        model = workloads.conv_net()
        model.compile("sgd", "sparse_categorical_crossentropy")
    processes = PROCESSES[variant]
    timer = EpochTimer()
    callbacks = [timer]
    total_epochs = 1 + epochs
    if variant == "two_alone":  # independent processes: make their timed epochs overlap
        callbacks = [_overlap(barrier, rank, processes, epochs), timer]
        total_epochs = 1 + 4 * epochs  # an upper bound; _Overlap stops the training
    model.fit(data, epochs=total_epochs, verbose=0, callbacks=callbacks)
    timed = list(zip(timer.seconds[1:1 + epochs], timer.steps[1:1 + epochs]))
    return {"seconds": min(seconds / steps for seconds, steps in timed),
            "replicas": replicas, "global_batch": global_batch, "epochs": timer.seconds,
            "steps": timer.steps}


def _overlap(barrier: str, rank: int, processes: int, epochs: int):
    """In `two_alone`: start the timed epochs together, keep training until both are done.

    A Keras callback; its `on_epoch_end` waits for the other process after the warm-up
    epoch, and stops the training once every process has finished `epochs` timed epochs.
    """
    import keras

    class Overlap(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 0:  # the warm-up epoch (tracing) is over
                _mark(barrier, "ready", rank)
                _wait_for(barrier, "ready", processes)
            elif epoch == epochs:  # the last timed epoch is over
                _mark(barrier, "done", rank)
            if epoch >= epochs:
                done = [f for f in os.listdir(barrier) if f.startswith("done")]
                self.model.stop_training = len(done) >= processes

    return Overlap()


# ---- the driver ------------------------------------------------------------------------

def run_variant(variant: str, *, epochs: int, timeout: float) -> float:
    """Runs the processes of one variant together; returns process 0's seconds per step.

    Each process runs in its own process group, its output going to files (no pipe can
    fill up). When a process fails, or any is still running after `timeout` seconds,
    every process group of the variant still running is killed and this raises.
    """
    from strategykit.launcher.worker_env import free_ports

    processes = PROCESSES[variant]
    scratch = tempfile.mkdtemp(prefix="sk-multi-worker-")
    ports = free_ports(processes)
    started: list[tuple[subprocess.Popen, str, str]] = []
    try:
        for rank in range(processes):
            env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"}
            env.pop("TF_CONFIG", None)
            if variant == "multi_worker":
                cluster = {"worker": [f"localhost:{port}" for port in ports]}
                env["TF_CONFIG"] = json.dumps(
                    {"cluster": cluster, "task": {"type": "worker", "index": rank}})
            out, err = (os.path.join(scratch, f"{rank}.{kind}") for kind in ("out", "err"))
            with open(out, "w") as stdout, open(err, "w") as stderr:
                process = subprocess.Popen(
                    [sys.executable, os.path.abspath(__file__), "--child", variant,
                     "--rank", str(rank), "--barrier", scratch, "--epochs", str(epochs)],
                    env=env, stdout=stdout, stderr=stderr, start_new_session=True)
            started.append((process, out, err))
        deadline = time.monotonic() + timeout
        while True:
            codes = [process.poll() for process, _, _ in started]
            if any(code not in (None, 0) for code in codes):
                problem = "a process failed"
                break
            if all(code == 0 for code in codes):
                problem = None
                break
            if time.monotonic() > deadline:
                problem = f"still running after {timeout:.0f} s"
                break
            time.sleep(0.05)
        if problem is not None:
            _kill(started)
            raise RuntimeError(f"{variant}: {problem}; killed every process group:\n"
                               + _describe(started))
        with open(started[0][1]) as file:
            return json.loads(file.read().strip().splitlines()[-1])["seconds"]
    finally:
        _kill(started)
        shutil.rmtree(scratch, ignore_errors=True)


def _kill(started) -> None:
    """SIGKILL to the process group of every process started here that still runs."""
    processes = [process for process, _, _ in started]
    signal_groups(processes, signal.SIGKILL)
    for process in processes:
        process.wait()


def _describe(started) -> str:
    parts = []
    for rank, (process, out, err) in enumerate(started):
        texts = []
        for path in (out, err):
            with open(path) as file:
                texts.append(file.read()[-3000:])
        parts.append(f"--- process {rank} (exit {process.returncode}):\n{texts[0]}\n{texts[1]}")
    return "\n".join(parts)


def compare_all(*, pairs: int, epochs: int, timeout: float) -> tuple[list[dict], dict]:
    """Rounds of every variant in fresh processes; returns the summaries and the times."""
    run_variant("multi_worker", epochs=epochs, timeout=timeout)  # warm-up round: file cache
    times: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
    for round_ in range(pairs):
        order = VARIANTS if round_ % 2 == 0 else VARIANTS[::-1]
        for variant in order:
            times[variant].append(run_variant(variant, epochs=epochs, timeout=timeout))
        print(f"round {round_ + 1}/{pairs} ({', '.join(order)}): "
              + ", ".join(f"{v} {times[v][-1] * 1e3:.2f} ms" for v in VARIANTS), flush=True)
    results = []
    for a, b in COMPARISONS:
        ratios = [x / y for x, y in zip(times[a], times[b])]
        results.append(harness._summary(a, b, ratios, {a: times[a], b: times[b]}, "separate"))
    return results, times


def print_times(times: dict[str, list[float]]) -> None:
    """Per-variant median step time with min and max, and the collectives' time per step."""
    print(f"\n{'variant (step time, ms)':<62} {'median':>7} {'min':>7} {'max':>7}")
    descriptions = {"multi_worker": "2 workers x 1 replica, global batch 64",
                    "one_process": "1 process x 2 replicas, global batch 64",
                    "two_alone": "2 processes x 1 replica, batch 32, no collective"}
    for variant in VARIANTS:
        ms = [t * 1e3 for t in times[variant]]
        label = f"{variant} ({descriptions[variant]})"
        print(f"{label:<62} {statistics.median(ms):7.2f} {min(ms):7.2f} {max(ms):7.2f}")
    collective = [(m - a) * 1e3 for m, a in zip(times["multi_worker"], times["two_alone"])]
    label = "collectives per step (multi_worker - two_alone)"
    print(f"{label:<62} {statistics.median(collective):7.2f} {min(collective):7.2f} "
          f"{max(collective):7.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=5, help="rounds of every variant")
    parser.add_argument("--epochs", type=int, default=EPOCHS,
                        help="timed epochs per process, after one warm-up epoch")
    parser.add_argument("--timeout", type=float, default=TIMEOUT_SECONDS,
                        help="seconds after which a variant's process groups are killed")
    parser.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--barrier", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_child(args.child, args.rank, args.barrier, args.epochs)))
        return
    start = time.monotonic()
    results, times = compare_all(pairs=args.pairs, epochs=args.epochs, timeout=args.timeout)
    harness.print_table(results)
    print_times(times)
    median = results[0]["median"]
    print(f"\ngoal multi_worker / one_process <= {GOAL}: "
          f"{'met' if median <= GOAL else 'NOT met'} (median {median:.3f}); "
          f"{time.monotonic() - start:.0f} s in all")


if __name__ == "__main__":
    main()
