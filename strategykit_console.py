"""The entry point of the `strategykit` command: TensorFlow's C++ log lines kept off screen.

TensorFlow prints C++ log lines from the moment it is imported, some before its logging
is set up, where `TF_CPP_MIN_LOG_LEVEL` does not reach them. Importing `strategykit`
imports TensorFlow, so this module lives outside the package: the command quiets
TensorFlow here, before anything imports it, and then runs `strategykit.cli.commands.main`.
`python -m strategykit` and `python -m strategykit.cli` come here too
(`strategykit.cli.run_as_module`).

Quiet means `TF_CPP_MIN_LOG_LEVEL=2` for TensorFlow and, for the lines it prints anyway,
a filter on the process's standard error: `strategykit.launcher.tensorflow_log`, which
describes the lines it drops; every other line passes unchanged. Nothing is quieted with
`--verbose`, or when the user set `TF_CPP_MIN_LOG_LEVEL` themselves. Importing
`strategykit` as a library changes no logging setting.

The package is first registered without running its `__init__` (which makes `sk.*` and
imports TensorFlow and Keras), so that the filter, in the standard-library-only
`strategykit.launcher`, is imported and installed before TensorFlow; the `__init__` then
runs on the same module object. `strategykit launch` (and `demo --workers N`, which
launches N demo workers) does not run it at all: the launcher only starts, watches and
restarts processes, and TensorFlow and Keras would cost about 4.5 s of CPU and 650 MB at
every launch (`benchmarks/launcher_start.py`).

Example:
    $ strategykit demo              # no TensorFlow log lines
    $ strategykit demo --verbose    # TensorFlow's log lines as TensorFlow prints them
    $ strategykit launch --workers 2 -- python train.py   # the launcher: no TensorFlow
"""

from __future__ import annotations

import importlib.util
import os
import sys
import types


def main(argv: list[str] | None = None) -> int:
    """Runs the `strategykit` command, quieted unless `--verbose` or the user's own
    `TF_CPP_MIN_LOG_LEVEL` asks otherwise; returns the exit code.

    The arguments are parsed before TensorFlow is imported: `--help` (of the command
    and of each subcommand) and a bad argument print at once, and only a command that
    runs imports the package (`finish_importing_package`)."""
    argv = sys.argv[1:] if argv is None else argv
    own_arguments = argv[: argv.index("--")] if "--" in argv else argv
    if "--verbose" not in own_arguments and "TF_CPP_MIN_LOG_LEVEL" not in os.environ:
        tensorflow_log().quiet_tensorflow()
    import_package_without_tensorflow()
    from strategykit.cli.commands import main as run  # argparse: no TensorFlow yet

    starts_workers = only_starts_workers(own_arguments)
    return run(argv, before_running=None if starts_workers else finish_importing_package)


def only_starts_workers(arguments: list[str]) -> bool:
    """Whether the command only starts worker processes: `launch`, and `demo --workers N`
    with N > 1 (whose workers are `demo --as-worker` processes, each importing TensorFlow
    itself).

    Example:
        >>> only_starts_workers(["demo", "--workers", "2"])
        True
        >>> only_starts_workers(["demo", "--replicas", "2"])
        False
    """
    if arguments[:1] == ["launch"]:
        return True
    if arguments[:1] != ["demo"] or "--as-worker" in arguments:
        return False
    workers = None
    for i, argument in enumerate(arguments):
        if argument == "--workers" and i + 1 < len(arguments):
            workers = arguments[i + 1]
        elif argument.startswith("--workers="):
            workers = argument.split("=", 1)[1]
    return workers is not None and workers.isdigit() and int(workers) > 1


def import_package_without_tensorflow() -> None:
    """Registers the `strategykit` package without running its `__init__`.

    Its subpackages then import alone: `strategykit.launcher.launch` imports neither
    TensorFlow nor Keras. Only for a process that runs nothing but strategykit's own
    command code (`sk.*` names are not defined in it) until `finish_importing_package`;
    does nothing when the package is already imported.
    """
    if "strategykit" not in sys.modules:
        spec = importlib.util.find_spec("strategykit")
        sys.modules["strategykit"] = importlib.util.module_from_spec(spec)


def finish_importing_package() -> None:
    """Runs the package's `__init__` on the module `import_package_without_tensorflow`
    registered: `sk.*` defined, TensorFlow imported. Does nothing when it has run."""
    package = sys.modules["strategykit"]
    if not _initialized(package):
        package.__spec__.loader.exec_module(package)


def _initialized(package: types.ModuleType) -> bool:
    """Whether the package's `__init__` has run (`__all__` is its last statement)."""
    return "__all__" in vars(package)


def quiet_tensorflow(*, import_strategykit: bool = True) -> None:
    """Quiets TensorFlow in a process of the user's as the command does, then imports
    strategykit unless told not to: `TF_CPP_MIN_LOG_LEVEL=2`, and TensorFlow's log lines
    filtered out of stderr (`strategykit.launcher.tensorflow_log.quiet_tensorflow`).

    Call it before TensorFlow is imported (examples/ray_train.py does, in its driver
    and in every Ray worker). The filter lasts until the interpreter exits.

    Args:
        import_strategykit: False for a process that may never train, such as each of
            the processes Ray starts for a job (Ray Train's controller and its other
            actors among them): the filter is installed, and neither strategykit nor
            TensorFlow is imported (about 4.5 s of CPU and 650 MB a process); a later
            `import strategykit` runs as usual.

    Example:
        >>> import subprocess, sys
        >>> code = ("import sys, strategykit_console; "
        ...         "strategykit_console.quiet_tensorflow(import_strategykit=False); "
        ...         "print('tensorflow' in sys.modules, 'strategykit' in sys.modules)")
        >>> subprocess.run([sys.executable, "-c", code], capture_output=True,
        ...                text=True).stdout.split()
        ['False', 'False']
    """
    registered_here = "strategykit" not in sys.modules
    tensorflow_log().quiet_tensorflow()
    if import_strategykit:
        finish_importing_package()
    elif registered_here:
        forget_package_without_tensorflow()


def forget_package_without_tensorflow() -> None:
    """Undoes `import_package_without_tensorflow` when the package's `__init__` has not
    run: the package and the modules imported through it leave `sys.modules`, so that the
    next `import strategykit` runs the package as usual. Modules already in use (the
    stderr filter) go on working."""
    package = sys.modules.get("strategykit")
    if package is not None and not _initialized(package):
        for name in [name for name in sys.modules
                     if name == "strategykit" or name.startswith("strategykit.")]:
            del sys.modules[name]


def tensorflow_log() -> types.ModuleType:
    """`strategykit.launcher.tensorflow_log`, imported without TensorFlow (the package
    registered by `import_package_without_tensorflow` when not imported yet)."""
    import_package_without_tensorflow()
    from strategykit.launcher import tensorflow_log as module

    return module


if __name__ == "__main__":
    sys.exit(main())
