"""Compares two variants of a workload in fresh processes, alternating, on a noisy machine.

A benchmark script defines its variants as functions that return seconds per step and
calls `main(__file__, variants)`. Run without arguments, it launches itself once per
variant and pair, alternating A B A B after a warm-up pair, each in a fresh process (the
device list and traced functions of one never leak into the other), and prints the
median of the pairwise ratios A/B with min and max. Inside a process, `fit_step_seconds`
warms up (the first epoch traces) and keeps the fastest epoch, since interference only
ever adds time.

    python benchmarks/distribution_tax.py --pairs 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def fit_step_seconds(model, data, *, steps: int, epochs: int = 4) -> float:
    """Seconds per `fit()` step: fastest of `epochs` timed epochs after one warm-up epoch."""
    from strategykit.timing import EpochTimer

    timer = EpochTimer()
    model.fit(data, epochs=epochs + 1, steps_per_epoch=steps, verbose=0, callbacks=[timer])
    return min(timer.seconds[1:]) / steps


def iteration_step_seconds(make_iterable: Callable, *, repeats: int = 5) -> float:
    """Seconds per element of iterating `make_iterable()`: fastest of `repeats` passes."""
    best = float("inf")
    for repeat in range(repeats + 1):
        start = time.perf_counter()
        count = sum(1 for _ in make_iterable())
        if repeat:  # the first pass traces and fills caches
            best = min(best, (time.perf_counter() - start) / max(count, 1))
    return best


def run_variant(script: str, variant: str, extra: list[str]) -> float:
    """Runs one variant in a fresh process and returns its seconds per step."""
    result = subprocess.run(
        [sys.executable, script, "--variant", variant, *extra],
        capture_output=True, text=True, check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"variant {variant!r} failed:\n{result.stderr[-4000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])["seconds"]


def compare(script: str, a: str, b: str, *, pairs: int, extra: list[str]) -> dict:
    """Alternates A and B in fresh processes; returns the ratios and their summary."""
    run_variant(script, a, extra)  # warm the OS file cache; not counted
    ratios, times = [], {a: [], b: []}
    for pair in range(pairs):
        seconds_a = run_variant(script, a, extra)
        seconds_b = run_variant(script, b, extra)
        times[a].append(seconds_a)
        times[b].append(seconds_b)
        ratios.append(seconds_a / seconds_b)
        print(f"pair {pair + 1}/{pairs}: {a} {seconds_a * 1e3:.2f} ms, "
              f"{b} {seconds_b * 1e3:.2f} ms, ratio {ratios[-1]:.3f}", flush=True)
    return {
        "a": a, "b": b, "ratios": ratios, "times": times,
        "median": statistics.median(ratios), "min": min(ratios), "max": max(ratios),
    }


def print_table(results: list[dict]) -> None:
    """Prints one row per comparison: median ratio A/B with min and max."""
    print(f"\n{'comparison (A / B, step time)':<52} {'median':>7} {'min':>7} {'max':>7} pairs")
    for r in results:
        label = f"{r['a']} / {r['b']}"
        print(f"{label:<52} {r['median']:7.3f} {r['min']:7.3f} {r['max']:7.3f} "
              f"{len(r['ratios']):5d}")


def main(script: str, variants: dict[str, Callable[[], float]],
         comparisons: list[tuple[str, str]]) -> None:
    """Entry point of a benchmark script: measure one variant, or compare them all."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=sorted(variants))
    parser.add_argument("--pairs", type=int, default=5)
    args = parser.parse_args()
    if args.variant:
        print(json.dumps({"seconds": variants[args.variant]()}))
        return
    results = [compare(script, a, b, pairs=args.pairs, extra=[]) for a, b in comparisons]
    print_table(results)
