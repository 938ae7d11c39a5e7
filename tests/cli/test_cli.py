import json
import os
import pathlib
import re
import runpy
import shutil
import subprocess
import sys

import pytest

from strategykit import upstream
from strategykit.cli import commands as cli

# TensorFlow's C++ log format: `I1123 16:39:56.123456 ...`, or before its logging starts
# `I0000 00:00:1795452128.332057 ...`; and absl's notice that comes with the latter.
TF_LOG_LINE = re.compile(r"[IWEF]\d{4} \d\d:\d\d:\d|WARNING: All log messages before absl")


def run_fresh(*args, program=sys.executable, **env):
    """Runs `program` (Python) in a fresh process with no logging variables (plus `env`)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("TF_CPP", "ABSL"))}
    return subprocess.run([program, *args], capture_output=True, text=True,
                          timeout=300, env={**clean, **env})


def tf_log_lines(result) -> list[str]:
    return [line for line in (result.stdout + result.stderr).splitlines()
            if TF_LOG_LINE.match(line)]


def test_info_json_describes_the_strategy_for_the_replicas_asked(capsys):
    assert cli.main(["info", "--replicas", "4", "--json"]) == 0
    facts = json.loads(capsys.readouterr().out)
    assert facts["strategy"]["replicas"] == 4
    assert facts["strategy"]["simulated"] is True
    assert facts["physical_devices"] == {"CPU": 1, "GPU": 0}
    assert len(facts["logical_devices"]["CPU"]) == 4
    assert facts["tensorflow"] and facts["keras"]


def test_info_table_has_one_aligned_row_per_fact(capsys):
    cli.main(["info", "--replicas", "2"])
    table, fixes = capsys.readouterr().out.split("\n\n")
    lines = table.splitlines()
    rows = dict(re.split(r"\s{2,}", line, maxsplit=1) for line in lines)
    assert rows["Replicas"] == "2"
    assert rows["All-reduce"] == "collective ring"
    assert rows["Simulated devices"] == "yes"
    assert rows["XLA by default"] == "off"  # no GPU
    value_columns = {line.index(value) for line, value in zip(lines, rows.values())}
    assert len(value_columns) == 1


def test_info_lists_the_checked_versions_and_each_fix_state(capsys):
    cli.main(["info"])
    fixes = capsys.readouterr().out.split("\n\n")[1].splitlines()
    assert fixes[0] == f"Upstream fixes (checked on {upstream.CHECKED_ON}):"
    assert "  installed: gradient_accumulation_steps under a tf.distribute strategy " \
        "(keras-team/keras#20582)" in fixes
    assert "  checked (private upstream code as pinned): the all-reduce sk.describe " \
        "names (tensorflow/tensorflow, unreported)" in fixes
    assert len(fixes) == 1 + len({(entry["affects"], entry["issue"])
                                  for entry in upstream.status()})


@pytest.mark.parametrize("value", ["0", "-3", "two"])
def test_info_rejects_a_replica_count_that_is_not_positive(capsys, value):
    with pytest.raises(SystemExit):
        cli.main(["info", "--replicas", value])
    assert f"must be a positive integer, received '{value}'" in capsys.readouterr().err


# Fresh processes, as a user runs the command. Each one that imports TensorFlow costs about
# 9 s of CPU: the module's fixtures below run once per test process and serve two tests
# each. The four tests that use them are marked slow, so that the suite deals them to one
# test process together (tests/slow_first.py); a split ran each fixture twice.

SETTINGS = """
import logging, os
before = os.fstat(2)
{imports}
print(os.environ.get("TF_CPP_MIN_LOG_LEVEL"), os.fstat(2) == before,
      logging.getLogger("tensorflow").level, logging.getLogger().level)
"""


def installed_command() -> str:
    """The installed `strategykit` script (beside this Python, or on the PATH)."""
    command = pathlib.Path(sys.executable).with_name("strategykit")
    found = str(command) if command.exists() else shutil.which("strategykit")
    assert found, f"no `strategykit` script beside {sys.executable} nor on the PATH: " \
        'install the package (pip install -e ".[dev]")'
    return found


@pytest.fixture(scope="module")
def quiet_info():
    """`strategykit info --replicas 4 --json` as a user types it: the installed script (its
    entry point `strategykit_console:main`), a fresh process with no logging variables."""
    return run_fresh("info", "--replicas", "4", "--json", program=installed_command())


@pytest.fixture(scope="module")
def tensorflow_alone():
    """A fresh process with no logging variables that imports TensorFlow and runs an op:
    what TensorFlow prints by itself, and the logging settings it leaves (`SETTINGS`)."""
    return run_fresh("-c", SETTINGS.format(imports="import tensorflow as tf; tf.constant(1)"))


@pytest.mark.slow
def test_installed_command_shows_four_replicas_on_a_machine_without_gpus(quiet_info):
    # A fresh process, as a user runs it: the command itself splits the CPU, and prints
    # nothing on stderr (no TensorFlow log line either: the next test).
    assert quiet_info.returncode == 0, quiet_info.stderr[-3000:]
    facts = json.loads(quiet_info.stdout)
    assert facts["strategy"]["replicas"] == 4 and facts["fixes"]
    assert quiet_info.stderr == ""


@pytest.mark.slow
def test_the_command_prints_no_tensorflow_log_line_unless_verbose(quiet_info, tensorflow_alone):
    # Quiet: the run the test above reads, on every line of its stdout and stderr.
    assert quiet_info.returncode == 0, quiet_info.stderr[-3000:]
    assert json.loads(quiet_info.stdout)["strategy"]["replicas"] == 4
    assert tf_log_lines(quiet_info) == []
    # The control: where TensorFlow logs at all, --verbose shows it as TensorFlow prints.
    if tf_log_lines(tensorflow_alone):
        verbose = run_fresh("-m", "strategykit_console", "info", "--verbose")
        assert verbose.returncode == 0
        assert tf_log_lines(verbose)


@pytest.mark.slow
def test_importing_the_library_changes_no_logging_setting(tensorflow_alone):
    # Against TensorFlow alone, which runs an op as the library's strategy does: the
    # control of the test above (its settings are those of a bare `import tensorflow`).
    library = run_fresh("-c", SETTINGS.format(
        imports="import strategykit as sk; sk.mirrored(replicas=2)"))
    assert library.stdout.split()[:2] == ["None", "True"]
    assert library.stdout == tensorflow_alone.stdout


def test_python_m_strategykit_cli_runs_the_command(monkeypatch, capsys):
    # `python -m strategykit.cli`, the command without its console script: its `__main__`
    # runs here; the installed command's fresh process above shows how a user's runs.
    monkeypatch.setattr(sys, "argv", ["strategykit", "info", "--replicas", "2", "--json"])
    with pytest.raises(SystemExit) as exit:
        runpy.run_module("strategykit.cli", run_name="__main__")
    assert exit.value.code == 0
    assert json.loads(capsys.readouterr().out)["strategy"]["replicas"] == 2


def test_the_filter_keeps_every_other_line_of_stderr():
    # The filter alone (no TensorFlow imported), as the command installs it.
    result = run_fresh("-c", """if True:
        import sys, strategykit_console
        strategykit_console.tensorflow_log().quiet_tensorflow()
        sys.stderr.write("kept 1\\nI0000 00:00:17.5  12 port.cc:153] dropped\\n")
        sys.stderr.write("E1123 16:39:56.123456  99 cuda_platform.cc:52] dropped\\n")
        sys.stderr.write("2026-11-27 08:16:03.752152: E external/x/cuda_fft.cc:477] dropped\\n")
        sys.stderr.write("To enable the following instructions: AVX2 FMA, in other operations, "
                         "rebuild TensorFlow with the appropriate compiler flags.\\n")
        sys.stderr.write("[worker 1] W0000 00:00:17.5  12 dataset.cc:997] dropped\\n")
        sys.stderr.write("kept 2")
        print("out", sorted(m for m in ("tensorflow", "keras") if m in sys.modules))
    """)
    assert result.stderr == "kept 1\nkept 2"
    assert result.stdout == "out []\n"


@pytest.mark.slow
def test_python_m_strategykit_is_the_command(quiet_info):
    # `python -m strategykit` and `python -m strategykit.cli` become the command's entry
    # point (strategykit/cli/run_as_module.py): `info` as the installed script prints it,
    # as quiet; `launch` imports no TensorFlow there, so its help is compared on all three
    # (`strategykit.cli`'s `info` runs the same replacement: one TensorFlow process less).
    result = run_fresh("-m", "strategykit", "info", "--replicas", "4", "--json")
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout == quiet_info.stdout
    assert tf_log_lines(result) == []
    helps = {run_fresh("-m", module, "launch", "--help").stdout
             for module in ("strategykit_console", "strategykit", "strategykit.cli")}
    assert len(helps) == 1 and "usage: strategykit launch --workers N" in helps.pop()
