"""The hang watch's verdicts on hand-written progress files, and the progress files
written by a worker's `ProgressFile` and its Keras callback."""

import json

import keras
import numpy as np

from strategykit.cluster.progress_reporter import ProgressReporter
from strategykit.launcher.hang_watch import HangWatch
from strategykit.launcher.progress_file import ProgressFile, read

NOW = 1_000_000.0


def _watch(tmp_path, reports, timeout=60):
    paths = []
    for k, report in enumerate(reports):
        path = tmp_path / f"worker-{k}.json"
        if report is not None:
            path.write_text(json.dumps(report))
        paths.append(str(path))
    return HangWatch(paths, timeout)


def _report(epoch=1, step=2, progress_ago=100.0, heartbeat_ago=0.5):
    return {"epoch": epoch, "step": step, "progress": NOW - progress_ago,
            "heartbeat": NOW - heartbeat_ago}


def test_a_job_that_progresses_is_not_hung(tmp_path):
    watch = _watch(tmp_path, [_report(progress_ago=10), _report(progress_ago=70)])
    assert watch.check(NOW) is None  # worker 0 made progress 10 s ago


def test_before_any_progress_nothing_is_watched(tmp_path):
    # Starting up (importing TensorFlow, tracing the first step) takes what it takes.
    silent = {"epoch": None, "step": None, "progress": None, "heartbeat": NOW - 500}
    assert _watch(tmp_path, [silent, None]).check(NOW) is None


def test_a_stopped_worker_is_named_with_its_process_state(tmp_path):
    watch = _watch(tmp_path, [_report(step=3), _report(step=2, heartbeat_ago=99)])
    assert watch.check(NOW, ["S", "T"]) == (
        "worker 1 is stopped (process state T: a SIGSTOP or Ctrl-Z) after step 2 of epoch 1; "
        "no worker made progress for 60 s")


def test_a_stopped_worker_is_named_before_one_furthest_behind(tmp_path):
    watch = _watch(tmp_path, [_report(step=1), _report(step=2)])
    assert watch.check(NOW, ["S", "T"]).startswith("worker 1 is stopped")


def test_a_worker_whose_heartbeat_stopped_is_named(tmp_path):
    watch = _watch(tmp_path, [_report(step=3), _report(step=2, heartbeat_ago=99)])
    assert watch.check(NOW) == ("worker 1 stopped its heartbeat after step 2 of epoch 1 (its "
                                "process is frozen); no worker made progress for 60 s")
    assert watch.check(NOW, ["S", "D"]) == (
        "worker 1 is frozen in the kernel (process state D: a hung disk or network file "
        "system, or a paused container) after step 2 of epoch 1; no worker made progress "
        "for 60 s")


def test_a_worker_that_never_reported_is_named(tmp_path):
    assert _watch(tmp_path, [_report(), None]).check(NOW) == (
        "worker 1 stopped its heartbeat before its first training step (its process is "
        "frozen); no worker made progress for 60 s")


def test_the_worker_furthest_behind_is_named(tmp_path):
    reports = [_report(epoch=2, step=1), _report(epoch=1, step=6), _report(epoch=2, step=1)]
    assert _watch(tmp_path, reports, timeout=30).check(NOW) == (
        "worker 1 is furthest behind, after step 6 of epoch 1; no worker made progress for "
        "30 s")


def test_workers_at_the_same_step_are_not_singled_out(tmp_path):
    assert _watch(tmp_path, [_report(), _report()]).check(NOW) == (
        "no worker made progress for 60 s; every worker is after step 2 of epoch 1")


def test_a_worker_that_exited_is_neither_watched_nor_named(tmp_path):
    # Its file stays, its heartbeat old: it ended (its exit code is the launcher's to judge).
    ended = _report(step=3, heartbeat_ago=99)
    watch = _watch(tmp_path, [_report(step=3, heartbeat_ago=99), ended])
    assert watch.check(NOW, ["S", "exited"]).startswith("worker 0 stopped its heartbeat")
    assert watch.check(NOW, ["exited", "exited"]) is None


def test_outside_fit_evaluate_and_predict_nothing_hangs(tmp_path):
    # After fit(): a chief saving a large model, or a worker exiting (Python stops a
    # daemon heartbeat thread while it shuts down), makes no progress by design.
    done = {**_report(step=6, heartbeat_ago=99), "calls": 0}
    assert _watch(tmp_path, [done, {**_report(step=6), "calls": 0}]).check(NOW) is None
    in_fit = {**_report(step=6), "calls": 1}
    assert _watch(tmp_path, [done, in_fit]).check(NOW) == (
        "worker 0 stopped its heartbeat after step 6 of epoch 1 (its process is frozen); no "
        "worker made progress for 60 s")


def test_timeout_zero_never_stops_a_job(tmp_path):
    assert _watch(tmp_path, [_report(heartbeat_ago=999)], timeout=0).check(NOW) is None


def test_the_progress_file_is_written_whole_by_its_heartbeat(tmp_path):
    path = str(tmp_path / "worker-0.json")
    progress = ProgressFile(path)
    assert read(path) is None
    progress.record(epoch=2, step=5)
    progress.record()  # an evaluation batch: progress, the last step kept
    progress.write()
    report = read(path)
    assert (report["epoch"], report["step"]) == (2, 5)
    assert report["heartbeat"] >= report["progress"]
    assert [p.name for p in tmp_path.iterdir()] == ["worker-0.json"]  # no temporary left


def test_the_callback_records_each_completed_step_counted_from_1(tmp_path):
    progress = ProgressFile(str(tmp_path / "worker-0.json"))
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    x = np.zeros((12, 2), "float32")
    calls = []

    class InCall(keras.callbacks.Callback):  # what the file says inside each call
        def on_train_batch_end(self, batch, logs=None):
            calls.append(progress._state["calls"])

        def on_test_batch_end(self, batch, logs=None):
            calls.append(progress._state["calls"])

    model.fit(x, x[:, :1], batch_size=4, epochs=2, verbose=0, validation_data=(x, x[:, :1]),
              callbacks=[ProgressReporter(progress), InCall()])
    progress.write()
    report = read(progress.path)
    assert (report["epoch"], report["step"]) == (2, 3)
    assert calls == [1, 1, 1, 2, 2, 2] * 2  # in fit(); in its validation as well
    assert report["calls"] == 0  # after fit()


def test_outside_the_launcher_from_env_adds_nothing_to_keras(monkeypatch):
    import strategykit as sk

    monkeypatch.delenv("STRATEGYKIT_PROGRESS_FILE", raising=False)
    sk.from_env()
    assert not any(isinstance(callback, ProgressReporter)
                   and isinstance(callback.progress, ProgressFile)  # not a worker's own watch
                   for callback in keras.callbacks.CallbackList([]).callbacks)
