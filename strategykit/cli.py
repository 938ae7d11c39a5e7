"""The `strategykit` command: `info`, `demo`."""

from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the `strategykit` command."""
    parser = argparse.ArgumentParser(
        prog="strategykit",
        description="Data-parallel Keras training across several devices.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    info = commands.add_parser("info", help="devices, strategy and all-reduce of this machine")
    info.add_argument(
        "--replicas", type=_positive_int, default=None,
        help="show the strategy for N replicas (logical devices when there are fewer)",
    )
    info.add_argument("--json", action="store_true", help="print JSON instead of a table")
    demo = commands.add_parser("demo", help="the main job: multi-replica training")
    demo.add_argument("--replicas", type=_positive_int, default=None)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Runs the `strategykit` command; returns the exit code."""
    args = build_parser().parse_args(argv)
    if args.command == "info":
        return _info(args)
    return _demo(args)


def _info(args) -> int:
    from strategykit import info

    print(info.render(info.collect(args.replicas), as_json=args.json))
    return 0


def _demo(args) -> int:
    from strategykit import info

    print(info.render(info.collect(args.replicas or 4)))
    return 0


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, received {text!r}")
    return value


if __name__ == "__main__":
    sys.exit(main())
