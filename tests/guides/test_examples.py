"""The scripts in examples/ run as their docstrings say."""

import os
import re
import signal
import subprocess
import sys

import pytest

from workers import TESTS

EXAMPLES = os.path.join(os.path.dirname(TESTS), "examples")

# A line of TensorFlow's C++ log (`I0000 00:00:1795452128.332057 ... cudart_stub.cc:31]`,
# `E1123 16:39:56.123456 ...`) or absl's notice before its logging starts, as the launcher
# forwards a worker's line (`[worker 1] I0000 ...`).
TF_LOG_LINE = re.compile(r"(\[worker \d+\] )?([IWEF]\d{4} \d\d:\d\d:\d|WARNING: All log "
                         r"messages before absl)")


@pytest.mark.slow
def test_multi_worker_example_trains_under_the_launcher_without_tensorflow_log_lines(tmp_path):
    # As a user's shell runs it: no logging variables, so the launcher quiets the workers.
    # Their TensorFlow prints C++ log lines that TF_CPP_MIN_LOG_LEVEL does not silence (at
    # import, at the end of training); the launcher drops them. This run is the suite's
    # check of that for workers that import TensorFlow: tests/launcher/test_launch.py shows
    # with --verbose that such lines come, and that the launcher keeps every other line.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TF_CPP", "ABSL"))}
    out = tmp_path / "run"
    launcher = subprocess.Popen(
        [sys.executable, "-m", "strategykit_console", "launch", "--workers", "2", "--",
         sys.executable, os.path.join(EXAMPLES, "train_multi_worker.py"), "--epochs", "2",
         "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        start_new_session=True)
    try:
        stdout, stderr = launcher.communicate(timeout=300)
    finally:  # never leave a worker waiting in a collective
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
    assert launcher.returncode == 0, stderr[-3000:]
    reports = re.findall(r"^\[worker (\d)\] test accuracy ([\d.]+)% on 2 replicas$", stdout,
                         re.MULTILINE)
    assert [worker for worker, _ in reports] == ["0"]  # printed by the chief only
    assert float(reports[0][1]) > 80  # seeded; 10% is chance
    assert sorted(os.listdir(out)) == ["history.csv", "loss.png", "model.keras"]
    logged = [line for line in (stdout + "\n" + stderr).splitlines() if TF_LOG_LINE.match(line)]
    assert not logged, logged[:5]
