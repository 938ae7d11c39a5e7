"""`strategykit --help` and argument errors print before TensorFlow is imported (it
costs about 10 s of CPU here): only a command that runs imports it."""

import json
import os
import subprocess
import sys

TIMEOUT = 60
HELPS = [["--help"], ["demo", "--help"], ["info", "--help"], ["check", "--help"],
         ["launch", "--help"]]
ERRORS = [["demo", "--epochs", "0"], ["info", "--bogus"], [], ["nosuchcommand"]]
SCRIPT = """
import json, sys, strategykit_console
seen = []
for argv in json.loads(sys.argv[1]):
    try:
        strategykit_console.main(argv)
    except SystemExit as end:
        seen.append([end.code, sorted({"tensorflow", "keras"} & set(sys.modules))])
print(json.dumps(seen))
"""


def _run(*args):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}  # no stderr filter for each call
    return subprocess.run([sys.executable, *args], capture_output=True, text=True,
                          timeout=TIMEOUT, env=env)


def test_help_and_bad_arguments_import_neither_tensorflow_nor_keras():
    result = _run("-c", SCRIPT, json.dumps(HELPS + ERRORS))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[-1]) == \
        [[0, []]] * len(HELPS) + [[2, []]] * len(ERRORS)
    assert "usage: strategykit demo" in result.stdout
    assert "argument --epochs: must be a positive integer, received '0'" in result.stderr
    assert "unrecognized arguments: --bogus" in result.stderr


def test_python_m_strategykit_help_imports_no_tensorflow():
    # `python -m strategykit` becomes the command (os.execv, -X options kept).
    result = _run("-X", "importtime", "-m", "strategykit", "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: strategykit")
    imported = [line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines()
                if line.startswith("import time:")]
    assert "strategykit.cli.commands" in imported
    assert not {"tensorflow", "keras"} & {name.split(".")[0] for name in imported}
