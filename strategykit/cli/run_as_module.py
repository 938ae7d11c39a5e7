"""`python -m strategykit` and `python -m strategykit.cli`: the `strategykit` command itself.

`python -m` imports the package, and so its `__init__` (which imports TensorFlow),
before it runs the package's `__main__`: too late to keep TensorFlow's first log lines
off screen, and `launch` would import TensorFlow, which the command does not. So the
package's `__init__` calls `run_the_command_instead` first: when this process is
`python [OPTIONS] -m strategykit[.cli] ARGS`, with the package being located, it
replaces itself (`os.execv`: the same process id, environment, Python options and open
files) with `python [OPTIONS] -m strategykit_console ARGS`, the command's entry point,
which the console script runs too. Output, exit codes and signals are then the
command's; the cost is one more interpreter start (about 20 ms).

Where a tool runs the module itself (`runpy.run_module`, `python -m pdb -m strategykit`),
nothing is replaced: `__main__` runs the command in that process, after the package's
`__init__` has imported TensorFlow, so the log lines TensorFlow prints when imported are
not filtered out there.

Example:
    >>> command_module(["python", "-m", "strategykit", "info"], ["-m", "info"])
    'strategykit'
    >>> command_module(["python", "-m", "strategykit.launcher.preload_server"], ["-m"])
"""

from __future__ import annotations

import os
import sys

COMMAND_MODULES = ("strategykit", "strategykit.__main__", "strategykit.cli",
                   "strategykit.cli.__main__")
"""The modules `python -m` runs as the `strategykit` command."""

CONSOLE = "strategykit_console"
"""The command's entry point, outside the package (the console script's module)."""


def command_module(orig_argv: list[str], argv: list[str]) -> str | None:
    """The module in `COMMAND_MODULES` that `python -m` is locating, or None.

    Args:
        orig_argv: the interpreter's command line (`sys.orig_argv`).
        argv: `sys.argv`, which is `["-m", ARGS...]` while `python -m` locates the module.
    """
    if argv[:1] != ["-m"] or len(orig_argv) < len(argv) + 1:
        return None
    token = orig_argv[len(orig_argv) - len(argv)]  # `strategykit`, or `-mstrategykit`
    name = token[token.index("m") + 1:] if token.startswith("-") and "m" in token else token
    return name if name in COMMAND_MODULES else None


def run_the_command_instead() -> None:
    """When this process is `python -m strategykit[.cli] ARGS`, being located, becomes
    `python -m strategykit_console ARGS` (`os.execv`); otherwise does nothing."""
    orig_argv = getattr(sys, "orig_argv", [])
    name = command_module(orig_argv, sys.argv)
    if name is None:
        return
    at = len(orig_argv) - len(sys.argv)
    token = orig_argv[at][:len(orig_argv[at]) - len(name)] + CONSOLE
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [orig_argv[0], *orig_argv[1:at], token, *sys.argv[1:]])
