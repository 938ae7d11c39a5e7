"""A killed worker costs nothing: `strategykit launch --restarts` + `BackupAndRestore`.

Two worker processes train 4 epochs under `strategykit launch`; one of them dies by
SIGKILL (at the start of an epoch, or while the chief writes the backup of the 3rd), is
stopped, or gets a SIGTERM. With a restart the job resumes after the last complete
backup, does no epoch twice, and ends with the weights of one device trained without
interruption on the global batch (which equals an uninterrupted 2-worker run:
tests/cluster/test_multi_worker.py). A backup of 2 workers resumes on 1 (a plain run) and
one of 1 on 2 workers with the same weights: the global batch stays 16 and batch norm is
synchronized. The jobs run with `--preload` (their workers forked from one process that
imported TensorFlow: 9 s of CPU less per worker; workers that are the command itself run
in tests/guides/test_examples.py and, faked, in test_launch.py). Each launcher and plain
run has its own process group, killed with it when the test's timeout passes; the plain
run is forked from the test process's fork server.
"""

import functools
import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import strategykit as sk

from multi_worker_model import PER_REPLICA, build_model, training_data
from workers import TEST_PATHS, run_processes

EPOCHS = 4
"""A job's first fault comes in the 3rd epoch or its backup, after 2 complete backups: the
resumed epochs tell "after the last complete backup" from "after the first" and "from
scratch"; a second fault, at the start of the 4th epoch, comes after the backup its
resumed run made, and the 4th epoch shows the last run goes on to the end. A SIGTERM
comes in the 2nd epoch: the launcher passes it on a few steps later (on a loaded machine
in the next epoch), still before the last. Each epoch costs each worker about 0.6 s of
CPU, its backup included; starting each worker process about 9 s."""
TIMEOUT = 300

pytestmark = pytest.mark.slow  # each test starts worker processes: started first

_WORKER = """
import json, os, signal, sys, time
sys.path[:0] = {tests!r}
import keras
import strategykit as sk
from multi_worker_model import PER_REPLICA, build_model, training_data

EPOCHS = {epochs}

out, how = sys.argv[1], sys.argv[2]
# Under `strategykit launch` or as a plain run (one process: attempt 0, worker 0).
attempt = int(os.environ.get("STRATEGYKIT_RESTART", "0"))
worker = int(os.environ.get("STRATEGYKIT_WORKER", "0"))
first_attempt = attempt == 0
run = os.environ.get("TEST_RUN", str(attempt))  # names the file of the epochs begun


def die():
    with open(f"{{out}}/killed", "w") as file:
        file.write(str(time.time()))
    os.kill(os.getpid(), signal.SIGKILL)


class Record(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        with open(f"{{out}}/began-{{run}}-{{worker}}", "w") as file:
            file.write(str(time.time()))

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch
        if sk.is_chief():
            with open(f"{{out}}/epochs-{{run}}", "a") as file:
                file.write(f"{{epoch}}\\n")
        victim = {{"at-epoch-2": (0, 1, 2), "chief-at-epoch-3": (0, 0, 3),
                   "torn-then-at-epoch-3": (1, 1, 3)}}.get(how)  # (attempt, worker, epoch)
        if victim == (attempt, worker, epoch):
            die()

    def on_train_batch_end(self, batch, logs=None):
        if sk.is_chief():
            with open(f"{{out}}/steps-{{run}}", "a") as file:
                file.write(f"{{self.epoch}}\\n")

    def on_train_batch_begin(self, batch, logs=None):
        if run == "0" and (self.epoch, batch) == (1, 2):  # the 2nd epoch, its 3rd step
            target = {{("sigterm-then-stop", 1): lambda: os.getpid(),
                       ("sigterm-launcher", 0): lambda: int(open(f"{{out}}/launcher-pid").read()),
                       }}.get((how, worker), lambda: None)()
            if target:  # as a scheduler preempting the worker or the whole job would
                with open(f"{{out}}/sigterm", "w") as file:
                    file.write(str(time.time()))
                os.kill(target, signal.SIGTERM)
        if how == "sigterm-then-stop" and attempt == 1 and worker == 1 and (
                self.epoch, batch) == (2, 3):  # 0-based: the 3rd epoch, its 4th step
            time.sleep(2)  # its report of step 3 written first (a heartbeat a second)
            with open(f"{{out}}/stopped", "w") as file:
                file.write(str(time.time()))
            os.kill(os.getpid(), signal.SIGSTOP)  # alive, but no progress: a hang


if how == "torn-then-at-epoch-3" and first_attempt and worker == 0:
    save_weights = keras.Model.save_weights

    def torn_save(model, filepath, *args, **kwargs):  # the 3rd epoch's backup: torn
        if ".writing" in str(filepath) and model.optimizer.iterations.numpy() == 18:
            with open(filepath, "wb") as file:
                file.write(b"\\x89HDF\\r\\n")
            die()
        return save_weights(model, filepath, *args, **kwargs)

    keras.Model.save_weights = torn_save

import atexit
atexit.register(lambda: open(f"{{out}}/exited-{{run}}-{{worker}}", "w").write(str(time.time())))
strategy = sk.from_env()
x, y = training_data()
with strategy.scope():
    model = build_model()
shuffled = how.startswith("sigterm")  # each epoch in the order of (seed, epoch)
model.fit(sk.shard((x, y), strategy, global_batch_size=PER_REPLICA * 2, shuffle=shuffled,
                   seed=11 if shuffled else None), epochs=EPOCHS, verbose=0, shuffle=False,
          callbacks=[Record(), sk.callbacks.BackupAndRestore(f"{{out}}/backup")])
if sk.is_chief():
    with open(f"{{out}}/weights.json", "w") as file:
        json.dump([w.tolist() for w in model.get_weights()], file)
"""


def _launch(tmp_path, how, *launch_options, run=None):
    """Runs the worker script under `strategykit launch --workers 2 --preload`."""
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    script = tmp_path / "train.py"
    script.write_text(_WORKER.format(tests=TEST_PATHS, epochs=EPOCHS))
    launcher = subprocess.Popen(
        [sys.executable, "-m", "strategykit_console", "launch", "--workers", "2",
         "--preload", *launch_options,
         "--", sys.executable, str(script), str(out), how],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **({"TEST_RUN": run} if run else {})})
    (out / "launcher-pid").write_text(str(launcher.pid))  # for a SIGTERM to the whole job
    err = _finish(launcher, "strategykit launch")
    return launcher.returncode, err, time.time(), out


def _plain_run(tmp_path, how, run):
    """Runs the worker script as a plain process (no TF_CONFIG: one worker, one replica),
    forked from the test process's fork server (`workers.run_processes`)."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "TEST_RUN": run}
    env.pop("TF_CONFIG", None)
    finished, = run_processes(str(tmp_path / "train.py"), [env],
                              args=(tmp_path / "out", how), timeout=TIMEOUT, check=False)
    return finished.returncode, finished.stderr


def _finish(process, what):
    """The process's stderr once it ends; its group killed and the test failed after
    TIMEOUT."""
    try:
        return process.communicate(timeout=TIMEOUT)[1]
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        pytest.fail(f"{what} still running after {TIMEOUT} s; killed")


def _epochs(out, run):
    return [int(line) for line in (out / f"epochs-{run}").read_text().split()]


@functools.cache
def _uninterrupted_weights(shuffled: bool) -> list[np.ndarray]:
    """One device's weights trained without interruption on the global batch; `shuffled`:
    in the order of `sk.shard(..., shuffle=True, seed=11)` on one replica. Trained once per
    test process (about 1.5 s of CPU each time): every test compares with one of the two."""
    x, y = training_data()
    if not shuffled:
        reference = build_model()
        reference.fit(x, y, batch_size=PER_REPLICA * 2, epochs=EPOCHS, verbose=0,
                      shuffle=False)
        return reference.get_weights()
    strategy = sk.mirrored(["/cpu:0"])  # the suite's first logical CPU: one replica
    with strategy.scope():
        reference = build_model()
    reference.fit(sk.shard((x, y), strategy, global_batch_size=PER_REPLICA * 2,
                           shuffle=True, seed=11), epochs=EPOCHS, verbose=0)
    return reference.get_weights()


def _assert_uninterrupted_weights(out, shuffled=False):
    """Weights equal one device's trained without interruption (`_uninterrupted_weights`)."""
    weights = json.loads((out / "weights.json").read_text())
    for got, expected in zip(weights, _uninterrupted_weights(shuffled), strict=True):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_each_restart_resumes_after_the_last_complete_backup_with_the_uninterrupted_weights(
        tmp_path):
    # Two faults, one job: the chief killed while writing the 3rd epoch's backup (a torn
    # file), then in the restart worker 1 killed at the start of the 4th epoch. On the
    # machine's network (--network=host) here; the other tests run in the job's private
    # network, the default: the same weights in both. A hang timeout of 20 s, which this
    # job's healthy attempts (their tracing, their restarts) must never trip.
    code, err, _, out = _launch(tmp_path, "torn-then-at-epoch-3", "--restarts", "2",
                                "--network=host", "--hang-timeout", "20")
    assert code == 0, err[-4000:]
    assert "on this machine's network." in err
    assert "worker 0 was killed by signal SIGKILL" in err
    assert "restarting the job (restart 1 of 2)" in err
    assert "worker 1 was killed by signal SIGKILL" in err
    assert "restarting the job (restart 2 of 2)" in err
    assert _epochs(out, 0) == [0, 1, 2]  # killed writing the backup after the 3rd epoch
    assert _epochs(out, 1) == [2, 3]  # from the backup after the 2nd; died in the 4th
    assert _epochs(out, 2) == [3]  # from the backup after the 3rd: no epoch done twice
    _assert_uninterrupted_weights(out)
    assert not (out / "backup").exists()  # deleted at the end of training


def test_without_restarts_the_backup_resumes_on_one_process_and_then_on_two_workers(
        tmp_path):
    code, err, ended, out = _launch(tmp_path, "at-epoch-2")
    assert code != 0
    assert "worker 1 was killed by signal SIGKILL" in err
    assert ended - float((out / "killed").read_text()) < 60
    assert not (out / "weights.json").exists()
    # The backup of 2 workers, resumed by a plain run (1 worker, the same global batch),
    # which is killed in its turn at the start of the 4th epoch.
    code, err = _plain_run(tmp_path, "chief-at-epoch-3", run="plain")
    assert code == -signal.SIGKILL, err[-4000:]
    # The backup of that one process, resumed on 2 workers.
    code, err, _, out = _launch(tmp_path, "resume", run="launched")
    assert code == 0, err[-4000:]
    assert _epochs(out, 0) == [0, 1, 2]
    assert _epochs(out, "plain") == [2, 3]
    assert _epochs(out, "launched") == [3]
    _assert_uninterrupted_weights(out)


def _steps(out, run):
    """Steps the chief trained in each epoch of a run."""
    epochs = [int(line) for line in (out / f"steps-{run}").read_text().split()]
    return {epoch: epochs.count(epoch) for epoch in sorted(set(epochs))}


def _sigterm_to_exit(out, launcher_ended=None):
    """Seconds from the SIGTERM to the last worker's exit: its Python exit, or, given
    the time the launcher ended, every worker's process gone (printed: -s shows them)."""
    exited = max(float((out / f"exited-0-{k}").read_text()) for k in range(2))
    sent = float((out / "sigterm").read_text())
    print(f"SIGTERM to every worker's Python exit: {exited - sent:.2f} s")
    if launcher_ended is None:
        return exited - sent
    print(f"SIGTERM to every worker process gone (the launcher ended): "
          f"{launcher_ended - sent:.2f} s")
    return launcher_ended - sent


def test_a_sigterm_to_a_worker_then_a_stopped_worker_each_restart_the_job_from_its_backup(
        tmp_path):
    # Two faults, one job. A SIGTERM to worker 1 in the 2nd epoch: every worker backs up
    # the same step, and the restart goes on from there. In that restart worker 1 stops
    # (SIGSTOP) in the 3rd epoch: TensorFlow ends worker 0 about 10 s after worker 1 stopped
    # sending heartbeats, long before the default hang timeout (300 s); worker 1 must be
    # named all the same, and that it is stopped. (The watch's own ending, with fake
    # workers: test_launch.py.)
    code, err, _, out = _launch(tmp_path, "sigterm-then-stop", "--restarts", "2")
    assert code == 0, err[-4000:]
    assert "after a SIGTERM every worker backed up the same step and stopped (exit 42)" in err
    # Worker 1 got it during step 3; the others may be in step 4 by the time they hear.
    assert "backed up epoch 2, step 4" in err
    assert "restarting the job (restart 1 of 2)" in err
    assert ("strategykit launch: worker 1 is stopped (process state T: a SIGSTOP or Ctrl-Z) "
            "after step 3 of epoch 3; worker 0 then exited with code 1 (it lost worker 1); "
            "stopped the other 1 worker.\n") in err, err[-4000:]
    assert "Traceback" not in err  # worker 0's, which only echoes it, is in a log file
    assert "restarting the job (restart 2 of 2)" in err
    assert _steps(out, 0) == {0: 6, 1: 4}
    steps = _steps(out, 1)  # nothing of the 2nd epoch redone, nothing skipped
    assert steps[1] == 2 and _epochs(out, 1) == [1, 2], steps
    assert _steps(out, 2) == {2: 6, 3: 6}  # from the backup after the 2nd epoch
    _assert_uninterrupted_weights(out, shuffled=True)
    assert _sigterm_to_exit(out) < 30
    stopped = float((out / "stopped").read_text())
    restarted = min(float((out / f"began-2-{k}").read_text()) for k in range(2))
    assert restarted - stopped < 60  # noticed, killed, started again


def test_sigterm_to_the_launcher_backs_up_and_the_same_command_resumes(tmp_path):
    # Worker 0 sends it to the launcher (its pid in a file of the test), as a scheduler
    # preempting the whole job would.
    code, err, ended, out = _launch(tmp_path, "sigterm-launcher")
    assert code == 128 + signal.SIGTERM, err[-4000:]
    assert "received SIGTERM; stopped 2 workers" in err
    # Sent during step 3 of epoch 2 and passed on to both workers by the launcher: backed
    # up after a later step (a few steps of this small model later; on a loaded machine
    # in the next epoch).
    backed_up = re.search(r"backed up epoch (\d+), step (\d+) to", err)
    assert backed_up, err[-4000:]
    epoch, step = int(backed_up.group(1)) - 1, int(backed_up.group(2))  # epoch 0-based
    assert (epoch, step) >= (1, 3), err[-4000:]
    assert not (out / "weights.json").exists()
    assert _sigterm_to_exit(out, launcher_ended=ended) < 30
    code, err, _, out = _launch(tmp_path, "sigterm-launcher", run="again")  # a requeue
    assert code == 0, err[-4000:]
    assert _steps(out, 0) == {**{done: 6 for done in range(epoch)}, epoch: step}
    rest = {epoch: 6 - step} if step < 6 else {}  # nothing left of the epoch after its 6th
    assert _steps(out, "again") == {**rest, **{later: 6 for later in range(epoch + 1, EPOCHS)}}
    _assert_uninterrupted_weights(out, shuffled=True)
