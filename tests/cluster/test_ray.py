"""`examples/ray_train.py` under Ray Train: 2 Ray workers train like one device.

A driver process runs the example's `main()` on a local Ray of its own (2 CPUs, this
machine's address) with 2 Ray workers, small data and 4 steps; its training function is
the example's, wrapped to write each worker's final weights. They must equal each other,
the chief's last Ray checkpoint, and one device trained on the global batch (shuffled
alike by `sk.shard`), moving statistics of synchronized batch norm included. `sk.shard`
gives each worker its own examples, so they differ with plain batch norm (the workers'
moving statistics) or with workers that shuffle apart (one device's weights): both tried.

The driver has its own process group and a hard timeout; Ray's processes (GCS, raylet,
workers) all carry a variable of the test in their environment, and any still running
when the driver ended is killed and fails the test: a Ray hang cannot hang the suite,
and no Ray process outlives it.
"""

import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import keras
import numpy as np
import pytest

import strategykit as sk

from workers import TEST_PATHS, TESTS

pytestmark = pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                                reason='Ray is not installed: pip install -e ".[dev]"')

EXAMPLES = os.path.join(os.path.dirname(TESTS), "examples")
EPOCHS = 2
TRAIN_EXAMPLES = 128  # 2 steps of 64 (32 a worker) an epoch
TIMEOUT = 240
TOLERANCE = 1e-5
MARK = "STRATEGYKIT_TEST_RAY"  # in the environment of every process of the test's Ray
TF_LOG_LINE = re.compile(r"[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+ \S+:\d+\]"
                         r"|All log messages before absl::InitializeLog")

_DRIVER = """
import json, os, sys
sys.path[:0] = {paths!r}
import ray_train

out = sys.argv[1]


def recording_loop(config):  # the example's, and each worker's final weights in a file
    import ray.train
    import strategykit as sk
    rank = ray.train.get_context().get_world_rank()
    seen = {{"tf_config": json.loads(os.environ["TF_CONFIG"]), "chief": sk.is_chief()}}
    model = ray_train.train(config)
    seen["weights"] = [w.tolist() for w in model.get_weights()]
    with open(f"{{out}}/worker-{{rank}}.json", "w") as file:
        json.dump(seen, file)


result = ray_train.main(["--workers", "2", "--epochs", "{epochs}", "--examples",
                         "{examples}", "--storage", out, "--name", "run"],
                        train_loop_per_worker=recording_loop)
print(json.dumps({{"checkpoint": result.checkpoint.path, "metrics": result.metrics,
                  "reported": [metrics for _, metrics in result.best_checkpoints]}}))
"""


def _marked_processes(mark: str) -> list[int]:
    """Processes whose environment holds `MARK=mark`: the driver and every Ray process."""
    needle = f"{MARK}={mark}".encode()
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                with open(f"/proc/{entry.name}/environ", "rb") as file:
                    if needle in file.read().split(b"\0"):
                        found.append(int(entry.name))
            except OSError:  # gone, or not ours
                pass
    return found


def _end_leftovers(mark: str, wait: float) -> list[str]:
    """Waits up to `wait` s for the marked processes to exit, then kills the rest;
    returns the command lines of those it killed."""
    deadline = time.monotonic() + wait
    while (left := _marked_processes(mark)) and time.monotonic() < deadline:
        time.sleep(0.5)
    killed = []
    for pid in left:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as file:
                killed.append(file.read().replace(b"\0", b" ").decode(errors="replace"))
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return killed


def _run_driver(tmp_path, meanwhile):
    """Runs the driver, and `meanwhile()` while it runs; returns (the driver's report, its
    output, the folder of its files, what `meanwhile` returned). Fails after TIMEOUT s."""
    script = tmp_path / "driver.py"
    script.write_text(_DRIVER.format(paths=[EXAMPLES, *TEST_PATHS], epochs=EPOCHS,
                                     examples=TRAIN_EXAMPLES))
    out = tmp_path / "out"
    out.mkdir()
    mark = str(tmp_path)
    ray_tmp = tempfile.mkdtemp(prefix="sk-ray-")  # short: Ray's socket paths live in it
    env = {**os.environ, MARK: mark, "RAY_TMPDIR": ray_tmp, "RAY_USAGE_STATS_ENABLED": "0",
           "PYTHONPATH": os.pathsep.join(filter(None, [EXAMPLES, *TEST_PATHS,
                                                       os.environ.get("PYTHONPATH")]))}
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)  # the example quiets TensorFlow itself
    env.pop("RAY_ADDRESS", None)
    driver = subprocess.Popen([sys.executable, str(script), str(out)], env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              start_new_session=True)
    started = time.monotonic()
    try:
        result = meanwhile()
        stdout, stderr = driver.communicate(timeout=max(1, TIMEOUT - (time.monotonic()
                                                                      - started)))
    except subprocess.TimeoutExpired:
        os.killpg(driver.pid, signal.SIGKILL)
        stdout, stderr = driver.communicate()
        _end_leftovers(mark, wait=0)
        pytest.fail(f"the Ray driver was still running after {TIMEOUT} s; killed:\n"
                    f"{stdout[-3000:]}\n{stderr[-6000:]}")
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
        leftovers = _end_leftovers(mark, wait=15)
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert driver.returncode == 0, f"{stdout[-3000:]}\n{stderr[-6000:]}"
    assert not leftovers, "Ray processes left after the driver exited:\n" + "\n".join(
        leftovers)
    return json.loads(stdout.strip().splitlines()[-1]), stdout + stderr, out, result


def _one_device(strategy):
    """The example's model trained on one device with the global batch of 2 workers."""
    sys.path.insert(0, EXAMPLES)
    try:
        import ray_train
    finally:
        sys.path.remove(EXAMPLES)
    keras.utils.set_random_seed(0)  # as the example, before the data and the model
    data = ray_train.load_data(TRAIN_EXAMPLES)
    global_batch_size = ray_train.BATCH_PER_REPLICA * 2
    train = sk.shard((data.x_train, data.y_train), strategy,
                     global_batch_size=global_batch_size, shuffle=True, seed=0)
    with strategy.scope():
        model = ray_train.build_model(data, global_batch_size)
    model.fit(train, epochs=EPOCHS, shuffle=False, verbose=0)
    return model


@pytest.mark.slow
def test_ray_train_workers_equal_one_device_on_the_global_batch(tmp_path, make_strategy):
    report, output, out, reference = _run_driver(
        tmp_path, meanwhile=lambda: _one_device(make_strategy(1)))
    workers = [json.loads((out / f"worker-{rank}.json").read_text()) for rank in range(2)]

    # Ray's TF_CONFIG: workers only, task index = world rank; rank 0 the chief.
    for rank, worker in enumerate(workers):
        assert worker["tf_config"]["task"] == {"type": "worker", "index": rank}
        assert list(worker["tf_config"]["cluster"]) == ["worker"]
        assert len(worker["tf_config"]["cluster"]["worker"]) == 2
    assert [worker["chief"] for worker in workers] == [True, False]

    # Both workers end with the same weights, the chief's checkpoint holds them, and
    # they are one device's on the global batch (moving mean and variance included).
    for got, other in zip(workers[0]["weights"], workers[1]["weights"]):
        np.testing.assert_array_equal(got, other)
    checkpoint = keras.saving.load_model(os.path.join(report["checkpoint"], "model.keras"))
    assert len(reference.get_weights()) == len(workers[0]["weights"])
    assert any("moving_mean" in w.path for w in reference.weights)  # synchronized BN's
    for got, saved, expected in zip(workers[0]["weights"], checkpoint.get_weights(),
                                    reference.get_weights()):
        np.testing.assert_array_equal(saved, got)
        np.testing.assert_allclose(got, expected, rtol=TOLERANCE, atol=TOLERANCE)

    # Ray got every epoch's logs with a checkpoint; each replica's loss, and they differ:
    # each worker trained on its own examples.
    assert [metrics["epoch"] for metrics in report["reported"]] == list(range(1, EPOCHS + 1))
    for metrics in report["reported"]:
        assert metrics["loss/replica_0"] != metrics["loss/replica_1"]
    assert report["metrics"]["epoch"] == EPOCHS  # Ray's result: the last checkpoint's
    assert report["checkpoint"] == str(out / "run" / f"epoch-{EPOCHS:04d}")

    # Quiet workers: no TensorFlow C++ log line, nor its Python INFO logs, nor Ray's
    # warning a second without its dashboard; the chief's Keras lines shown, once.
    assert not [line for line in output.splitlines() if TF_LOG_LINE.search(line)]
    assert "INFO:tensorflow" not in output
    assert "State API may be temporarily unavailable" not in output
    assert output.count(f"Epoch {EPOCHS}/{EPOCHS}") == 1
    assert output.count("test accuracy") == 1
