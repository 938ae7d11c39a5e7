"""Without `strategykit launch`, a job whose peer died or is stuck fails, never waits.

A dead peer: TensorFlow's coordination service notices its missing heartbeats and every
other worker's all-reduce fails about 12 s later. A peer alive but stuck: each worker's
own watch (`strategykit.cluster.stall_watchdog`) ends it after STRATEGYKIT_HANG_TIMEOUT
seconds without a completed step, and its peers fail in turn. Real worker processes
with their own TF_CONFIG, each group killed when the test's timeout passes.
"""

import time

import pytest

from strategykit.cluster import stall_watchdog
from strategykit.cluster.stall_watchdog import Watch

from workers import run_workers

_STUCK_WORKER = """
import os, signal, sys, time
import keras, numpy as np
import strategykit as sk

how = sys.argv[1]
strategy = sk.from_env()
worker = int(os.environ["STRATEGYKIT_WORKER"])
x = np.random.default_rng(0).normal(size=(256, 5)).astype("float32")
with strategy.scope():
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")


class Fault(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        # Inside the first epoch: on a loaded machine an epoch's end and the next one's
        # start can take longer than the test's 4 s, which the watch rightly reports.
        if worker == 1 and (self.epoch, batch) == (0, 2):
            print(f"fault at {time.time()}", file=sys.stderr, flush=True)
            if how == "die":
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(600)  # alive, heartbeats going on, but stuck


model.fit(sk.shard((x, x[:, :1]), strategy, global_batch_size=16), epochs=50, verbose=0,
          callbacks=[Fault()])
"""


def _fault_time(finished) -> float:
    line = next(line for line in finished[1].stderr.splitlines() if line.startswith("fault at"))
    return float(line.split()[-1])


def test_a_stuck_peer_ends_the_job_after_the_hang_timeout(tmp_path):
    finished = run_workers(_STUCK_WORKER, args=["stuck"], check=False, timeout=120,
                           env={"STRATEGYKIT_HANG_TIMEOUT": "4"}, tmp_path=tmp_path)
    ended = time.time()
    assert [f.returncode for f in finished] != [0, 0]
    assert finished[1].returncode == 124, finished[1].stderr[-3000:]
    assert ("strategykit: worker 1 made no progress for 4 s (last step 2 of epoch 1): this "
            "worker or a peer is stuck. Exiting with code 124") in finished[1].stderr
    assert finished[0].returncode != 0  # its own watch, or the stuck peer's exit
    assert ended - _fault_time(finished) < 4 + 40


@pytest.mark.slow
def test_a_dead_peer_fails_the_others_within_seconds(tmp_path):
    finished = run_workers(_STUCK_WORKER, args=["die"], check=False, timeout=120,
                           env={"STRATEGYKIT_HANG_TIMEOUT": "0"}, tmp_path=tmp_path)
    ended = time.time()
    assert finished[1].returncode == -9
    assert finished[0].returncode != 0
    # TensorFlow reports the dead peer by its missing heartbeats or, when the step's
    # all-reduce notices first (a loaded machine), by the collective's lost connection.
    stderr = finished[0].stderr
    assert ("stopped sending heartbeats" in stderr
            or ("UnavailableError" in stderr and "/task:1" in stderr)), stderr[-3000:]
    assert ended - _fault_time(finished) < 40  # about 12 s here


def _watch(timeout=5.0):
    exits = []
    return Watch(timeout, worker=1, exit=exits.append), exits


def test_the_watch_fires_only_inside_a_call_after_its_first_step():
    watch, _ = _watch()
    watch._thread = object()  # no thread: the test calls check itself
    assert watch.check(now=1e12) is None  # no call running
    watch.enter_call()
    assert watch.check(now=1e12) is None  # started, no step yet: tracing never counts
    watch.record(epoch=2, step=3)
    now = time.time()
    assert watch.check(now + 4) is None
    assert watch.check(now + 6).startswith(
        "strategykit: worker 1 made no progress for 5 s (last step 3 of epoch 2)")
    watch.enter_call()  # validation inside fit
    watch.leave_call()
    assert watch.check(now + 6) is not None
    watch.leave_call()  # fit returned: your own code after it is never cut short
    assert watch.check(now + 600) is None


def test_a_timeout_of_zero_turns_the_watch_off():
    watch, _ = _watch(timeout=0)
    watch._thread = object()
    watch.enter_call()
    watch.record()
    assert watch.check(now=time.time() + 1e6) is None


@pytest.mark.parametrize("value", ["soon", "-1", "nan"])
def test_a_bad_timeout_is_an_error(monkeypatch, value):
    monkeypatch.setenv("STRATEGYKIT_HANG_TIMEOUT", value)
    with pytest.raises(ValueError, match=(
            rf"STRATEGYKIT_HANG_TIMEOUT must be a number of seconds >= 0. Received: "
            rf"STRATEGYKIT_HANG_TIMEOUT='{value}'. Use e.g. STRATEGYKIT_HANG_TIMEOUT=600")):
        stall_watchdog.timeout_from_env()
