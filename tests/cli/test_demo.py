import csv
import os
import re
import subprocess
import sys

import pytest
from test_cli import TF_LOG_LINE

import strategykit_console
from strategykit.cli import commands as cli
from strategykit.cli.demo import DEFAULT_EPOCHS, build_classifier, run_demo

from conftest import progress_lines


def summary_rows(text: str) -> dict:
    rows = (re.split(r"\s{2,}", line, maxsplit=1) for line in text.strip().splitlines())
    return {row[0]: row[1] for row in rows if len(row) == 2}


@pytest.mark.slow
def test_the_readme_demo_reaches_95_percent_and_writes_its_plot_and_history(tmp_path):
    # The README's first command, as a user runs it: a fresh process through the
    # command's entry point, default settings, no logging or threading variables.
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TF_CPP", "ABSL", "TF_NUM_INTRAOP"))}
    result = subprocess.run(
        [sys.executable, "-m", "strategykit_console", "demo", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=900, env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = summary_rows(result.stdout.split("\n\n")[-1])
    assert summary["Replicas"] == "4 (simulated)"
    assert summary["Batch norm"] == "synchronized"
    assert float(summary["Test accuracy"].rstrip("%")) >= 95.0
    assert (tmp_path / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with open(tmp_path / "history.csv") as file:
        history = list(csv.DictReader(file))
    assert len(history) == DEFAULT_EPOCHS == 6
    assert {f"loss/replica_{k}" for k in range(4)} <= set(history[0])
    # The console: no TensorFlow log line; the bar shows the spread and fits 160 columns.
    output = result.stdout + result.stderr
    assert not [line for line in output.splitlines() if TF_LOG_LINE.match(line)]
    lines = progress_lines(result.stdout)
    assert lines[-1].startswith("21/21 ") and "loss/min:" in lines[-1]
    assert not [line for line in lines if "loss/replica_" in line]
    assert max(len(line) for line in lines) <= 160
    assert "ran out of data" not in output
    assert re.fullmatch(r"[\d.]+ steps/s of 64 examples, [\d,]+ examples/s per replica",
                        summary["Throughput"])


def test_demo_without_sync_bn_on_two_replicas(tmp_path):
    result = run_demo(replicas=2, epochs=1, sync_bn=False, out=tmp_path, verbose=0)
    rows = summary_rows(result.summary())
    assert rows["Replicas"] == "2 (simulated)"
    assert rows["Batch norm"] == "per replica"
    assert rows["XLA"] == "off (jit_compile='auto' on a machine without GPU)"
    assert result.xla is False and result.strategy["xla"] == "off"
    assert rows["Epochs"] == "1"
    assert 0.0 <= result.test_accuracy <= 1.0
    assert result.plot_path.exists() and result.history_path.exists()


def test_classifier_has_batch_norm_to_convert():
    model = build_classifier((8, 8, 1), 10)
    assert model.output_shape == (None, 10)
    assert sum("batch_normalization" in layer.name for layer in model.layers) == 3


def test_demo_on_a_tfds_dataset_that_is_not_prepared_is_a_clear_error(tmp_path, capsys):
    code = cli.main(["demo", "--dataset", "mnist", "--data-dir", str(tmp_path), "--epochs", "1",
                     "--out", str(tmp_path / "out")])
    assert code == 2
    error = capsys.readouterr().err
    assert error.startswith("strategykit demo: error: ")
    assert "mnist" in error and str(tmp_path) in error


def test_check_command_passes_on_this_machine(capsys):
    assert cli.main(["check", "--replicas", "2"]) == 0
    assert capsys.readouterr().out.startswith("PASSED: 2 replicas x 16 examples against 1 device")


@pytest.mark.slow
def test_demo_across_two_worker_processes_reaches_the_same_accuracy(tmp_path):
    # `strategykit demo --workers 2`: 2 worker processes of 1 replica, through the
    # launcher; the same global batch and data order as 2 replicas in one process.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TF_CPP", "ABSL"))}
    launcher = subprocess.Popen(
        [sys.executable, "-m", "strategykit_console", "demo", "--workers", "2", "--epochs",
         "1", "--out", str(tmp_path / "workers")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        start_new_session=True)
    try:
        out, err = launcher.communicate(timeout=300)
    finally:  # never leave a worker waiting in a collective
        if launcher.poll() is None:
            os.killpg(launcher.pid, 9)
    assert launcher.returncode == 0, err[-3000:]
    summary = summary_rows(out.split("[worker 0] \n")[-1].replace("[worker 0] ", ""))
    assert summary["Replicas"] == "2 on 2 worker processes"
    one_process = run_demo(replicas=2, epochs=1, out=tmp_path / "one", verbose=0)
    assert abs(float(summary["Test accuracy"].rstrip("%")) / 100
               - one_process.test_accuracy) <= 0.01
    assert sorted(os.listdir(tmp_path / "workers")) == ["history.csv", "loss.png"]
    assert "[worker 1]" not in out  # the chief's bar and summary only
    assert not [line for line in (out + err).splitlines() if TF_LOG_LINE.search(line)]


def test_demo_with_workers_and_replicas_is_an_error(capsys):
    assert cli.main(["demo", "--workers", "2", "--replicas", "2"]) == 2
    assert "Pass either --workers or --replicas, not both. Received: --workers 2 " \
           "--replicas 2" in capsys.readouterr().err


def test_demo_across_workers_imports_no_tensorflow_in_the_launching_process():
    # Like `strategykit launch`: only the workers import TensorFlow (about 8 s of CPU).
    assert strategykit_console.only_starts_workers(["demo", "--workers", "2"])
    assert strategykit_console.only_starts_workers(["demo", "--epochs", "1", "--workers=3"])
    assert not strategykit_console.only_starts_workers(["demo", "--workers", "1"])
    assert not strategykit_console.only_starts_workers(["demo", "--as-worker", "--out", "x"])
    assert not strategykit_console.only_starts_workers(["demo"])
    code = ("import sys, strategykit_console; "
            "code = strategykit_console.main(['demo', '--workers', '2', '--replicas', '2']); "
            "print(code, sorted({'tensorflow', 'keras'} & set(sys.modules)))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60)
    assert result.stdout.strip().splitlines()[-1] == "2 []", result.stderr
    assert "Pass either --workers or --replicas, not both." in result.stderr
