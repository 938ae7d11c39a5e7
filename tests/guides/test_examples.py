"""The scripts in examples/ run as their docstrings say."""

import os
import re
import signal
import subprocess
import sys

from workers import TESTS

EXAMPLES = os.path.join(os.path.dirname(TESTS), "examples")


def test_multi_worker_example_under_the_launcher(tmp_path):
    out = tmp_path / "run"
    launcher = subprocess.Popen(
        [sys.executable, "-m", "strategykit_console", "launch", "--workers", "2", "--",
         sys.executable, os.path.join(EXAMPLES, "train_multi_worker.py"), "--epochs", "3",
         "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = launcher.communicate(timeout=300)
    finally:  # never leave a worker waiting in a collective
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
    assert launcher.returncode == 0, stderr[-3000:]
    reports = re.findall(r"^\[worker (\d)\] test accuracy ([\d.]+)% on 2 replicas$", stdout,
                         re.MULTILINE)
    assert [worker for worker, _ in reports] == ["0"]  # printed by the chief only
    assert float(reports[0][1]) > 80  # 96.67% seeded here; 10% is chance
    assert sorted(os.listdir(out)) == ["history.csv", "loss.png", "model.keras"]
