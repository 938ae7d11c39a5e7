import json
import re
import subprocess
import sys

import pytest

from strategykit import cli


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
    lines = capsys.readouterr().out.splitlines()
    rows = dict(re.split(r"\s{2,}", line, maxsplit=1) for line in lines)
    assert rows["Replicas"] == "2"
    assert rows["All-reduce"] == "collective ring"
    assert rows["Simulated devices"] == "yes"
    value_columns = {line.index(value) for line, value in zip(lines, rows.values())}
    assert len(value_columns) == 1


@pytest.mark.parametrize("value", ["0", "-3", "two"])
def test_info_rejects_a_replica_count_that_is_not_positive(capsys, value):
    with pytest.raises(SystemExit):
        cli.main(["info", "--replicas", value])
    assert f"must be a positive integer, received '{value}'" in capsys.readouterr().err


def test_installed_command_shows_four_replicas_on_a_machine_without_gpus():
    # A fresh process, as a user runs it: the command itself splits the CPU.
    result = subprocess.run(
        [sys.executable, "-m", "strategykit.cli", "info", "--replicas", "4", "--json"],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout)["strategy"]["replicas"] == 4
