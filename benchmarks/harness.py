"""Compares two variants of a workload in fresh processes, alternating, on a noisy machine.

A benchmark script defines its variants as functions that return seconds per step and
calls `main(__file__, variants, comparisons)`. Run without arguments, it launches itself
once per variant and pair, alternating A B A B after a warm-up pair, each in a fresh
process (the device list and traced functions of one never leak into the other), and
prints the median of the pairwise ratios A/B with min and max. Inside a process,
`fit_step_seconds` warms up (the first epoch traces) and keeps the fastest epoch, since
interference only ever adds time.

Interference here comes in bursts of seconds and sometimes slows a whole process, which
blurs a difference of a few percent between processes. Where two variants can share a
process (same devices, separate models), a script also passes `interleaved`: each fresh
process then runs both, one short `fit()` round of each in turn (`fit_round_seconds`),
so neighbouring rounds see the same interference; its ratio is the median of the
rounds' ratios, and the first variant alternates from process to process.

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
    from strategykit.cli.timing import EpochTimer

    timer = EpochTimer()
    model.fit(data, epochs=epochs + 1, steps_per_epoch=steps, verbose=0, callbacks=[timer])
    return min(timer.seconds[1:]) / steps


def fit_round_seconds(model, data, *, steps: int, callbacks=()) -> float:
    """Seconds per step of one `fit()` round: its second epoch (the first starts the input).

    Call it once per round after the model's step has been traced.
    """
    from strategykit.cli.timing import EpochTimer

    timer = EpochTimer()
    model.fit(data, epochs=2, steps_per_epoch=steps, verbose=0, callbacks=[*callbacks, timer])
    return timer.seconds[1] / steps


def alternated_rounds(setups: dict, order: list[str], *, rounds: int, steps: int) -> dict:
    """`{variant: [seconds per step of each round]}`: one `fit()` round of each variant's
    `(model, data)` in `setups`, in `order`, round after round (their steps traced)."""
    seconds = {variant: [] for variant in order}
    for _ in range(rounds):
        for variant in order:
            seconds[variant].append(fit_round_seconds(*setups[variant], steps=steps))
    return seconds


def traced_and_alternated(order: list[str], setup: Callable, *, rounds: int,
                          steps: int) -> dict:
    """`alternated_rounds` of the variants in `order`, each's `(model, data)` made by
    `setup(variant)` and its step traced by one uncounted round first."""
    setups = {}
    for variant in order:
        setups[variant] = setup(variant)
        fit_round_seconds(*setups[variant], steps=steps)  # traces
    return alternated_rounds(setups, order, rounds=rounds, steps=steps)


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
    return _run_child(script, ["--variant", variant, *extra])["seconds"]


def _run_child(script: str, arguments: list[str]) -> dict:
    """Runs the script in a fresh process; returns the JSON of its last output line."""
    result = subprocess.run(
        [sys.executable, script, *arguments], capture_output=True, text=True, check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(arguments)} failed:\n{result.stderr[-4000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


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
    return _summary(a, b, ratios, times, "separate")


def compare_interleaved(script: str, a: str, b: str, *, pairs: int) -> dict:
    """Both variants in each fresh process, rounds interleaved; A first in every other one."""
    ratios, times = [], {a: [], b: []}
    for pair in range(pairs):
        order = (a, b) if pair % 2 == 0 else (b, a)
        rounds = _run_child(script, ["--interleaved", ",".join(order)])
        ratio = statistics.median(x / y for x, y in zip(rounds[a], rounds[b]))
        for name in (a, b):
            times[name].append(min(rounds[name]))
        ratios.append(ratio)
        print(f"process {pair + 1}/{pairs} ({' then '.join(order)}, {len(rounds[a])} rounds): "
              f"fastest {a} {times[a][-1] * 1e3:.2f} ms, {b} {times[b][-1] * 1e3:.2f} ms, "
              f"median ratio {ratio:.3f}", flush=True)
    return _summary(a, b, ratios, times, "interleaved")


def _summary(a, b, ratios, times, how) -> dict:
    return {
        "a": a, "b": b, "how": how, "ratios": ratios, "times": times,
        "median": statistics.median(ratios), "min": min(ratios), "max": max(ratios),
    }


def print_table(results: list[dict]) -> None:
    """Prints one row per comparison: median ratio A/B with min and max."""
    print(f"\n{'comparison (A / B, step time)':<52} {'how':<12} {'median':>7} {'min':>7} "
          f"{'max':>7} pairs")
    for r in results:
        label = f"{r['a']} / {r['b']}"
        print(f"{label:<52} {r['how']:<12} {r['median']:7.3f} {r['min']:7.3f} "
              f"{r['max']:7.3f} {len(r['ratios']):5d}")


def main(script: str, variants: dict[str, Callable[[], float]],
         comparisons: list[tuple[str, str]],
         interleaved: Callable[[list[str]], dict[str, list[float]]] | None = None,
         interleaved_comparisons: list[tuple[str, str]] | None = None) -> None:
    """Entry point of a benchmark script: measure one variant, or compare them all.

    Args:
        script: the script's `__file__`.
        variants: `{name: function returning seconds per step}`, one variant each.
        comparisons: `(A, B)` pairs of variant names; each is compared in separate
            processes, and also interleaved when `interleaved` is given.
        interleaved: `interleaved(order)` runs the named variants in one process, one
            round each in `order`, round after round, and returns `{name: [seconds
            per step of each round]}`.
        interleaved_comparisons: the comparisons `interleaved` can run (default: all);
            a whole call, say, is timed in separate processes only.
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=sorted(variants))
    parser.add_argument("--interleaved", help=argparse.SUPPRESS)
    parser.add_argument("--pairs", type=int, default=5)
    modes = ["separate", "interleaved"] if interleaved else ["separate"]
    parser.add_argument("--how", choices=modes, nargs="+", default=modes,
                        help="separate processes per variant, or both interleaved in each")
    args = parser.parse_args()
    if args.variant:
        print(json.dumps({"seconds": variants[args.variant]()}))
        return
    if args.interleaved:
        print(json.dumps(interleaved(args.interleaved.split(","))))
        return
    results = []
    for a, b in comparisons:
        if "separate" in args.how:
            results.append(compare(script, a, b, pairs=args.pairs, extra=[]))
        if "interleaved" in args.how and (a, b) in (interleaved_comparisons or comparisons):
            results.append(compare_interleaved(script, a, b, pairs=args.pairs))
    print_table(results)
