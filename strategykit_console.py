"""The entry point of the `strategykit` command: TensorFlow's C++ log lines kept off screen.

TensorFlow prints C++ log lines from the moment it is imported (`cudart_stub.cc ...
Could not find cuda drivers`, `cpu_feature_guard.cc ...`), some before its logging is
set up, where `TF_CPP_MIN_LOG_LEVEL` does not reach them, and more at the end of
training (`local_rendezvous.cc ... recv item cancelled`). Importing `strategykit`
imports TensorFlow, so this module lives outside the package: the command quiets
TensorFlow here, before anything imports it, and then runs `strategykit.cli.commands.main`.

Quiet means `TF_CPP_MIN_LOG_LEVEL=2` for TensorFlow and, for the lines it prints
anyway, a filter on the process's standard error (file descriptor 2, so C++ output
passes through it too) that drops every line in TensorFlow's C++ log format
(`I0000 00:00:1795452128.332057    2921 port.cc:153] ...`) and absl's notice
`WARNING: All log messages before absl::InitializeLog() is called are written to
STDERR`; every other line passes unchanged. Nothing is quieted with `--verbose`, or when
the user set `TF_CPP_MIN_LOG_LEVEL` themselves. Importing `strategykit` as a library
changes no logging setting.

`strategykit launch` (and `demo --workers N`, which launches N demo workers) does not
import TensorFlow at all: the launcher only starts, watches and restarts processes, and
importing the package as a library (its `__init__` makes `sk.*`) would import TensorFlow
and Keras, about 4.5 s of CPU and 650 MB at every launch (`benchmarks/launcher_start.py`).
For these commands the package is registered without running its `__init__`, so that
only `strategykit.cli` and `strategykit.launcher` are imported.

Example:
    $ strategykit demo              # no TensorFlow log lines
    $ strategykit demo --verbose    # TensorFlow's log lines as TensorFlow prints them
    $ strategykit launch --workers 2 -- python train.py   # the launcher: no TensorFlow
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import re
import sys
import threading

TF_LOG_LINE = re.compile(
    r"^(?:\[worker \d+\] )?"
    r"(?:[IWEF]\d{4} \d\d:\d\d:\d+\.\d+\s+\d+ \S+:\d+\]"
    r"|\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [IWEF] \S+:\d+\]"
    r"|WARNING: All log messages before absl::InitializeLog\(\) is called)"
)
"""A line of TensorFlow's C++ log (or absl's notice before its logging starts), also as
`strategykit launch` forwards a worker's (`[worker k] I0000 ...`). Both formats:
absl's (`I0000 00:00:1795452128.332057    2921 port.cc:153] ...`) and TensorFlow's own,
which TensorFlow 2.18 and 2.20 print some lines in
(`2026-11-27 08:16:03.752152: E external/.../cuda_fft.cc:477] ...`)."""


def main(argv: list[str] | None = None) -> int:
    """Runs the `strategykit` command, quieted unless `--verbose` or the user's own
    `TF_CPP_MIN_LOG_LEVEL` asks otherwise; returns the exit code."""
    argv = sys.argv[1:] if argv is None else argv
    own_arguments = argv[: argv.index("--")] if "--" in argv else argv
    if "--verbose" not in own_arguments and "TF_CPP_MIN_LOG_LEVEL" not in os.environ:
        quiet_tensorflow()
    if only_starts_workers(own_arguments):
        import_package_without_tensorflow()
    from strategykit.cli.commands import main as run

    return run(argv)


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
    command code (`sk.*` names are not defined in it); does nothing when the package is
    already imported.
    """
    if "strategykit" not in sys.modules:
        spec = importlib.util.find_spec("strategykit")
        sys.modules["strategykit"] = importlib.util.module_from_spec(spec)


def quiet_tensorflow() -> None:
    """Sets `TF_CPP_MIN_LOG_LEVEL=2` and filters TensorFlow's log lines out of stderr.

    Call it before TensorFlow is imported. The filter lasts until the interpreter exits.
    """
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    sys.stderr.flush()
    terminal = os.dup(2)
    read_end, write_end = os.pipe()
    os.dup2(write_end, 2)
    os.close(write_end)
    reader = threading.Thread(target=_forward, args=(read_end, terminal), daemon=True,
                              name="strategykit-stderr-filter")
    reader.start()

    def restore() -> None:
        sys.stderr.flush()
        os.dup2(terminal, 2)  # closes the pipe's last write end: the reader sees its end
        reader.join(timeout=2)

    atexit.register(restore)


def _forward(read_end: int, terminal: int) -> None:
    """Copies the pipe to the terminal, line by line, without TensorFlow's log lines."""
    pending = b""
    with os.fdopen(read_end, "rb", buffering=0) as pipe:
        while chunk := pipe.read(65536):
            pending += chunk
            lines = re.split(rb"(?<=[\r\n])", pending)
            pending = lines.pop()  # no line end yet (b"" when the chunk ended one)
            if pending[:1] not in (b"", b"I", b"W", b"E", b"F") and not pending[:1].isdigit():
                lines.append(pending)  # no log line: a prompt or a progress bar, shown now
                pending = b""
            _write(terminal, lines)
        _write(terminal, [pending])


def _write(terminal: int, lines: list[bytes]) -> None:
    kept = b"".join(line for line in lines
                    if not TF_LOG_LINE.match(line.decode(errors="replace")))
    while kept:
        kept = kept[os.write(terminal, kept):]


if __name__ == "__main__":
    sys.exit(main())
