"""How long deleting a dataset iterator blocks, after it was read a little and left idle.

TensorFlow 2.21 deletes a distributed dataset's iterator only when its tf.data threads
wake up by themselves (those seen in gdb wait in tf.data's autotuning loop, whose period
doubles up to 60 s), so the thread that drops the last reference waits: inside `fit()` when it
returns, or inside whatever code Python's garbage collector interrupts. This measures
it, each kind of iterator in a fresh process: `plain` (an undistributed tf.data
iterator), `distributed` (`strategy.experimental_distribute_dataset`, 4 replicas) and
`shard` (`sk.shard`, 4 replicas). Each process makes `--iterators` iterators, reads two
batches from each, sleeps `--idle` seconds, then deletes them one by one.

    python benchmarks/iterator_release.py --idle 30 --iterators 4
"""

from __future__ import annotations

import argparse
import subprocess
import sys

KINDS = ("plain", "distributed", "shard")


def _measure(kind: str, iterators: int, idle: float) -> list[float]:
    """In this process: the seconds each deletion blocked."""
    import gc
    import time

    import numpy as np
    import tensorflow as tf

    import strategykit as sk

    strategy = sk.mirrored(replicas=4)
    x = np.random.default_rng(0).normal(size=(40, 3)).astype("float32")
    examples = tf.data.Dataset.from_tensor_slices((x, x.sum(1)))
    made = {
        "plain": lambda: examples.batch(16).prefetch(tf.data.AUTOTUNE),
        "distributed": lambda: strategy.experimental_distribute_dataset(examples.batch(16)),
        "shard": lambda: sk.shard((x, x.sum(1)), strategy, global_batch_size=16),
    }[kind]
    live = []
    for _ in range(iterators):
        iterator = iter(made())
        next(iterator), next(iterator)
        live.append(iterator)
    time.sleep(idle)
    seconds = []
    while live:
        start = time.perf_counter()
        live.pop()
        gc.collect()
        seconds.append(time.perf_counter() - start)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--idle", type=float, default=30.0)
    parser.add_argument("--iterators", type=int, default=4)
    parser.add_argument("--kind", choices=KINDS, help=argparse.SUPPRESS)  # one process's part
    args = parser.parse_args()
    if args.kind:
        print(" ".join(f"{s:.1f}" for s in _measure(args.kind, args.iterators, args.idle)))
        return
    # The processes mostly sleep, so they run side by side.
    running = {
        kind: subprocess.Popen(
            [sys.executable, __file__, "--kind", kind, "--idle", str(args.idle),
             "--iterators", str(args.iterators)],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        for kind in KINDS
    }
    print(f"seconds each deletion blocked, {args.iterators} iterators idle {args.idle:g} s:")
    for kind, process in running.items():
        print(f"  {kind:12} {process.communicate()[0].strip()}")


if __name__ == "__main__":
    main()
