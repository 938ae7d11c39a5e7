"""The `strategykit` command: `info`, `demo`, `check`.

The installed command enters through `strategykit_console`, which keeps TensorFlow's C++
log lines off screen unless `--verbose` is given.
"""

from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the `strategykit` command."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--verbose", action="store_true",
                        help="show TensorFlow's own C++ log lines (hidden by default)")
    parser = argparse.ArgumentParser(
        prog="strategykit", parents=[common],
        description="Data-parallel Keras training across several devices.",
    )
    commands = parser.add_subparsers(dest="command", required=True)

    info = commands.add_parser("info", parents=[common],
                               help="devices, strategy and all-reduce of this machine")
    _add_replicas(info, "show the strategy for N replicas (logical devices when there are "
                        "fewer); default: every GPU, or the CPU")
    info.add_argument("--json", action="store_true", help="print JSON instead of a table")

    demo = commands.add_parser(
        "demo", parents=[common],
        help="the main job: train a conv net on real data across replicas",
        description="Trains a small conv net with synchronized batch norm on scikit-learn's "
                    "8x8 digits across replicas, shows every replica's loss, and writes the "
                    "loss plot and the history.",
    )
    _add_replicas(demo, "number of replicas; default: every GPU, or 4 simulated on a CPU")
    demo.add_argument("--epochs", type=_positive_int, default=None,
                      help="epochs to train (default 12)")
    demo.add_argument("--sync-bn", action=argparse.BooleanOptionalAction, default=True,
                      help="synchronize batch norm across replicas (default: yes)")
    demo.add_argument("--out", default="strategykit-demo",
                      help="folder for loss.png and history.csv (default: strategykit-demo)")
    demo.add_argument("--dataset", default=None,
                      help="a prepared TFDS image-classification dataset instead of digits")
    demo.add_argument("--data-dir", default=None, help="where that TFDS dataset is prepared")

    check = commands.add_parser(
        "check", parents=[common],
        help="self-test: N-replica training equals 1-device training here",
    )
    _add_replicas(check, "replicas to compare against one device (default 2)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Runs the `strategykit` command; returns the exit code.

    A bad argument that only shows once the command runs (an unprepared TFDS dataset,
    say) ends with its message on stderr and exit code 2, as argparse's own errors do.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    command = {"info": _info, "demo": _demo, "check": _check}[args.command]
    try:
        return command(args)
    except ValueError as error:
        print(f"{parser.prog} {args.command}: error: {error}", file=sys.stderr)
        return 2


def _info(args) -> int:
    from strategykit import info

    print(info.render(info.collect(args.replicas), as_json=args.json))
    return 0


def _demo(args) -> int:
    from strategykit import demo

    result = demo.run_demo(
        replicas=args.replicas, epochs=args.epochs or demo.DEFAULT_EPOCHS,
        sync_bn=args.sync_bn, out=args.out, dataset=args.dataset, data_dir=args.data_dir,
    )
    print()
    print(result.summary())
    return 0


def _check(args) -> int:
    from strategykit import self_test

    report = self_test.run(replicas=args.replicas or 2)
    print(report)
    return 0 if report.passed else 1


def _add_replicas(parser: argparse.ArgumentParser, help_text: str) -> None:
    parser.add_argument("--replicas", type=_positive_int, default=None, help=help_text)


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
