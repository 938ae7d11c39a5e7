"""The `strategykit` command: `info`, `demo`, `check`, `launch`.

The installed command enters through `strategykit_console`, which keeps TensorFlow's C++
log lines off screen unless `--verbose` is given.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from strategykit.launcher import hang_watch
from strategykit.launcher.launch import NETWORKS


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
    demo.add_argument("--workers", type=_positive_int, default=None, metavar="N",
                      help="train across N local worker processes (strategykit launch), "
                           "one replica each on CPUs")
    demo.add_argument("--as-worker", action="store_true", help=argparse.SUPPRESS)
    demo.add_argument("--epochs", type=_positive_int, default=None,
                      help="epochs to train (default 6)")
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
    _add_launch(commands, common)
    return parser


def _add_launch(commands, common: argparse.ArgumentParser) -> None:
    launch = commands.add_parser(
        "launch", parents=[common],
        usage="strategykit launch --workers N [--restarts K] [--hang-timeout S] [--port P] "
              "[--network {private,host}] [--gpus-per-worker G] [--preload] "
              "-- COMMAND [ARGS ...]",
        help="run N local worker processes of a command, each with its TF_CONFIG",
        description="Starts N worker processes of COMMAND on this machine, each with its "
                    "TF_CONFIG (worker 0 is the chief), forwards their output prefixed "
                    "[worker k], and stops them all when one dies or the job hangs.",
    )
    launch.add_argument("--workers", type=int, required=True, metavar="N",
                        help="worker processes")
    launch.add_argument("--restarts", type=int, default=0, metavar="K",
                        help="start the whole job again up to K times when a worker dies "
                             "(default 0)")
    launch.add_argument("--hang-timeout", type=float, default=hang_watch.DEFAULT_TIMEOUT,
                        metavar="S",
                        help="stop (or restart) the job when no worker has made training "
                             f"progress for S seconds; 0 never (default "
                             f"{hang_watch.DEFAULT_TIMEOUT:g})")
    launch.add_argument("--port", type=int, default=None, metavar="P",
                        help="worker k listens on port P+k (default: free ports)")
    launch.add_argument("--network", choices=NETWORKS, default="private",
                        help="private (default): the job's own network, its ports reachable "
                             "from no other machine, and no other machine reachable from it; "
                             "host: this machine's network")
    launch.add_argument("--gpus-per-worker", type=int, default=None, metavar="G",
                        help="GPUs for each worker; 0 runs them on the CPU (default: the "
                             "GPUs found, divided evenly)")
    launch.add_argument("--preload", action="store_true",
                        help="import TensorFlow once and fork every worker from it: workers "
                             "and restarts start in milliseconds (python SCRIPT or python -m "
                             "MODULE commands only)")
    launch.add_argument("worker_command", nargs=argparse.REMAINDER, metavar="COMMAND",
                        help="the command every worker runs, after --")


def main(argv: list[str] | None = None,
         before_running: Callable[[], None] | None = None) -> int:
    """Runs the `strategykit` command; returns the exit code.

    A bad argument that only shows once the command runs (an unprepared TFDS dataset,
    say) ends with its message on stderr and exit code 2, as argparse's own errors do.

    Args:
        argv: the arguments; default None: `sys.argv[1:]`.
        before_running: called once the arguments are parsed, before the command runs
            (`strategykit_console` imports the package, and TensorFlow, there): `--help`
            and argparse's errors come without it. Default None: nothing.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    if before_running is not None:
        before_running()
    command = {"info": _info, "demo": _demo, "check": _check, "launch": _launch}[args.command]
    try:
        return command(args)
    except ValueError as error:
        print(f"{parser.prog} {args.command}: error: {error}", file=sys.stderr)
        return 2


def _info(args) -> int:
    from strategykit.cli import info

    print(info.render(info.collect(args.replicas), as_json=args.json))
    return 0


def _demo(args) -> int:
    if args.workers and args.replicas:
        raise ValueError(
            f"Pass either --workers or --replicas, not both. Received: --workers "
            f"{args.workers} --replicas {args.replicas}. Across workers each worker has "
            "its own devices (one replica per worker on CPUs).")
    if args.workers and args.workers > 1:
        from strategykit.launcher.launch import launch

        return launch(_demo_worker_command(args), workers=args.workers, preload=True)
    from strategykit.cli import demo
    from strategykit.cluster.roles import is_chief
    from strategykit.strategy.build import from_env

    result = demo.run_demo(
        replicas=args.replicas, epochs=args.epochs or demo.DEFAULT_EPOCHS,
        sync_bn=args.sync_bn, out=args.out, dataset=args.dataset, data_dir=args.data_dir,
        strategy=from_env() if args.as_worker else None,
        verbose="auto" if is_chief() else 0,
    )
    if is_chief():
        print()
        print(result.summary())
    return 0


def _demo_worker_command(args) -> list[str]:
    """The `strategykit demo` command line each worker of `demo --workers N` runs."""
    command = [sys.executable, "-m", "strategykit_console", "demo", "--as-worker",
               "--out", args.out, "--sync-bn" if args.sync_bn else "--no-sync-bn"]
    for option, value in (("--epochs", args.epochs), ("--dataset", args.dataset),
                          ("--data-dir", args.data_dir)):
        if value is not None:
            command += [option, str(value)]
    return command + (["--verbose"] if args.verbose else [])


def _check(args) -> int:
    from strategykit.cli import demo_check

    report = demo_check.run(replicas=args.replicas or 2)
    print(report)
    return 0 if report.passed else 1


def _launch(args) -> int:
    from strategykit.launcher.launch import launch

    command = args.worker_command
    return launch(command[1:] if command[:1] == ["--"] else command, workers=args.workers,
                  restarts=args.restarts, port=args.port, gpus_per_worker=args.gpus_per_worker,
                  hang_timeout=args.hang_timeout, network=args.network, verbose=args.verbose,
                  preload=args.preload)


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

