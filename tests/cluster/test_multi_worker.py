"""Keras `fit()`, `evaluate()`, `predict()` across worker processes equal one device.

Each test runs real worker processes on loopback (`tests/workers.py`: free ports, hard
timeout, process groups killed); the reference runs here on one device with the global
batch. Every replica gets different examples, so removing any synchronization (the
gradient all-reduce, synchronized batch norm) makes the weights differ.
"""

import csv
import os

import numpy as np
import pytest

import strategykit as sk

from multi_worker_model import (
    EPOCHS,
    PER_REPLICA,
    build_model,
    model_with_metrics,
    training_data,
    validation_data,
)
from workers import run_workers

TOLERANCE = 1e-5


_FIT = """
import json, sys
import keras, numpy as np
import strategykit as sk
from multi_worker_model import (EPOCHS, PER_REPLICA, build_model, model_with_metrics,
                                training_data, validation_data)

out = sys.argv[1]
strategy = sk.from_env()
replicas = strategy.num_replicas_in_sync
x, y = training_data()
with strategy.scope():
    model = build_model()
callbacks = [
    sk.callbacks.CrossReplicaLoss(),
    sk.callbacks.LossPlot(f"{out}/loss.png", show=False),
    keras.callbacks.ModelCheckpoint(out + "/ckpt-{epoch}.weights.h5", save_weights_only=True),
    keras.callbacks.CSVLogger(f"{out}/history.csv"),
    keras.callbacks.TensorBoard(f"{out}/tensorboard"),
]
validation = sk.shard(validation_data(replicas), strategy,
                      global_batch_size=PER_REPLICA * replicas)
history = model.fit(sk.shard((x, y), strategy, global_batch_size=PER_REPLICA * replicas),
                    epochs=EPOCHS, verbose=0, shuffle=False, callbacks=callbacks,
                    validation_data=validation)
exact = sk.shard((x, y), strategy, global_batch_size=PER_REPLICA * replicas,
                 pad_remainder=False)
with strategy.scope():
    evaluated = model_with_metrics(model)
print(json.dumps({
    "paths": [callbacks[2].filepath, callbacks[3].filename, callbacks[4].log_dir],
    "replicas": replicas, "chief": sk.is_chief(), "chief_of_strategy": sk.is_chief(strategy),
    "history": history.history,
    "evaluate": model.evaluate(exact, verbose=0),
    "metrics": evaluated.evaluate(validation, verbose=0, return_dict=True),
    "predict": model.predict(sk.shard(x[:90], strategy, global_batch_size=replicas * 4,
                                      pad_remainder=False), verbose=0).tolist(),
    "weights": [w.tolist() for w in model.get_weights()],
}))
"""


def _one_device(replicas: int):
    x, y = training_data()
    model = build_model()
    validation = validation_data(replicas)
    history = model.fit(x, y, batch_size=PER_REPLICA * replicas, epochs=EPOCHS, verbose=0,
                        shuffle=False, validation_data=validation)
    return model, history.history, x, y, validation


def _metrics_of_one_device(model, validation, batch_size):
    x, y, weights = validation
    return model_with_metrics(model).evaluate(x, y, sample_weight=weights,
                                              batch_size=batch_size, verbose=0,
                                              return_dict=True)


# Three workers: a chief and two others (each with its own scratch files); two workers
# train in the other tests here and in test_launch_resume.py.
@pytest.mark.parametrize("workers", [3])
def test_fit_across_workers_equals_one_device(tmp_path, workers):
    out = tmp_path / "out"
    reports = [w.last_json() for w in run_workers(_FIT, workers, args=[out], tmp_path=tmp_path)]
    model, history, x, y, validation = _one_device(workers)
    metrics = _metrics_of_one_device(model, validation, PER_REPLICA * workers)

    for report in reports:
        assert report["replicas"] == workers
        for weights, reference in zip(report["weights"], model.get_weights()):
            # moving mean and variance included
            np.testing.assert_allclose(weights, reference, rtol=TOLERANCE, atol=TOLERANCE)
        np.testing.assert_allclose(report["history"]["loss/mean"], history["loss"], rtol=1e-5)
        np.testing.assert_allclose(report["history"]["loss"], history["loss"], rtol=1e-5)
        # Validation and metrics over a padded final batch of 1 example: as one device.
        np.testing.assert_allclose(report["history"]["val_loss"], history["val_loss"],
                                   rtol=1e-5)
        assert report["metrics"].keys() == metrics.keys()
        for key, value in metrics.items():
            np.testing.assert_allclose(report["metrics"][key], value, rtol=1e-5, err_msg=key)
        np.testing.assert_allclose(report["evaluate"], model.evaluate(x, y, verbose=0),
                                   rtol=1e-5)
        np.testing.assert_allclose(report["predict"], model.predict(x[:90], verbose=0),
                                   atol=1e-5)
    # Every replica of the job has its loss, and every worker logs the same.
    replica_keys = {key for key in reports[0]["history"] if key.startswith("loss/replica_")}
    assert replica_keys == {f"loss/replica_{k}" for k in range(workers)}
    assert all(report["history"] == reports[0]["history"] for report in reports)
    # Replicas saw different data: their losses differ.
    assert len({reports[0]["history"][key][0] for key in replica_keys}) == workers

    assert reports[0]["paths"] == [
        f"{out}/ckpt-{{epoch}}.weights.h5", f"{out}/history.csv", f"{out}/tensorboard"]
    for index, report in enumerate(reports[1:], start=1):  # the others' scratch files
        assert all(f"strategykit-worker{index}-" in path for path in report["paths"])
    assert [r["chief"] for r in reports] == [True] + [False] * (workers - 1)
    assert [r["chief_of_strategy"] for r in reports] == [True] + [False] * (workers - 1)
    # Files written once, by the chief: exactly what one worker writes, nothing else.
    assert sorted(os.listdir(out)) == sorted(
        ["loss.png", "history.csv", "tensorboard"]
        + [f"ckpt-{epoch}.weights.h5" for epoch in range(1, EPOCHS + 1)])
    with open(out / "history.csv") as file:
        rows = list(csv.DictReader(file))
    assert [int(row["epoch"]) for row in rows] == list(range(EPOCHS))
    np.testing.assert_allclose([float(row["loss"]) for row in rows], history["loss"],
                               rtol=1e-5)
    checkpoint = build_model()
    checkpoint.optimizer.build(checkpoint.trainable_variables)
    checkpoint.load_weights(out / f"ckpt-{EPOCHS}.weights.h5")
    for saved, reference in zip(checkpoint.get_weights(), model.get_weights()):
        np.testing.assert_allclose(saved, reference, rtol=TOLERANCE, atol=TOLERANCE)


_SHARDS = """
import json
import numpy as np, tensorflow as tf
import strategykit as sk

strategy = sk.from_env()
seen = {}
for name, size in (("even", 12), ("padded", 10)):
    data = (np.arange(size, dtype="float32"), np.zeros(size, "float32"))
    batches = sk.shard(data, strategy, global_batch_size=4)
    seen[name] = [[x.numpy().astype(int).tolist(), w.numpy().tolist()]
                  for x, _, w in (strategy.experimental_local_results(b)[0] for b in batches)]
shuffled = sk.shard(data, strategy, global_batch_size=4, shuffle=True, seed=3)
seen["shuffled"] = [step[0] for step in sk.replica_batches(shuffled, strategy)]
try:
    sk.shard(data, strategy, global_batch_size=4, shuffle=True)
except ValueError as error:
    seen["error"] = str(error)
print(json.dumps(seen))
"""


def test_shard_gives_each_worker_its_slices_of_every_global_batch(tmp_path):
    # range(12), 2 workers of 1 replica, global batch 4: worker 0 reads [0, 1], [4, 5],
    # [8, 9]; worker 1 the rest. range(10): the final step [8, 9] is padded to 4, each
    # worker getting one real example (weight 4 / 2 = 2) and one copy of weight 0.
    first, second = (w.last_json() for w in run_workers(_SHARDS, 2, tmp_path=tmp_path))
    assert [x for x, _ in first["even"]] == [[0, 1], [4, 5], [8, 9]]
    assert [x for x, _ in second["even"]] == [[2, 3], [6, 7], [10, 11]]
    assert [x for x, _ in first["padded"]][:2] == [[0, 1], [4, 5]]
    assert [x for x, _ in second["padded"]][:2] == [[2, 3], [6, 7]]
    assert first["padded"][2][0][0] == 8 and second["padded"][2][0][0] == 9
    assert first["padded"][2][1] == second["padded"][2][1] == [2.0, 0.0]
    # Shuffled with one seed: every example once over both workers.
    shuffled = [x for worker in (first, second) for step in worker["shuffled"] for x in step]
    assert sorted(int(x) for x in shuffled) == list(range(10))
    assert first["error"].startswith(
        "shuffle=True across several workers needs a seed") and "Received: seed=None" in (
        first["error"])


_NAN = """
import keras, numpy as np
import strategykit as sk
from multi_worker_model import build_model, training_data

strategy = sk.from_env()
x, y = training_data()
y[8:16] = np.nan  # the second replica's labels in the first step
with strategy.scope():
    model = build_model()
model.fit(sk.shard((x, y), strategy, global_batch_size=16), epochs=1, verbose=0,
          shuffle=False, callbacks=[sk.callbacks.CrossReplicaLoss(on_nan="raise")])
"""


def test_nan_guard_names_the_worker_and_replica(tmp_path):
    finished = run_workers(_NAN, 2, tmp_path=tmp_path, check=False)
    for worker in finished:
        assert worker.returncode != 0
        assert "Non-finite loss on replica 1 on worker 1 (nan) of 2 at epoch 0, batch 0" in (
            worker.stderr), worker.stderr[-3000:]


_WITHOUT_FIXES = """
import json
import strategykit as sk
from strategykit import upstream
from multi_worker_model import build_model, training_data

strategy = sk.from_env()
x, y = training_data()
data = sk.shard((x, y), strategy, global_batch_size=16)  # installs every fix: shard first
errors = {}
for fix in upstream.multi_worker.FIXES:
    fix.uninstall()
    with strategy.scope():
        model = build_model()
    try:
        model.fit(data, epochs=1, verbose=0)
    except Exception as error:
        errors[fix.attribute] = str(error)[:300]
    fix.install()
print(json.dumps(errors))
"""


def test_keras_fit_fails_across_workers_without_each_fix(tmp_path):
    # When a Keras release makes these pass, the fix is no longer needed: remove it.
    for worker in run_workers(_WITHOUT_FIXES, 2, tmp_path=tmp_path):
        errors = worker.last_json()
        assert "Attempt to convert a value (PerReplica" in errors["_maybe_symbolic_build"]
        assert "Invalid reduction dimension 0" in errors["reduce_per_replica"]


_UNSHARED_BACKUP = """
import os, sys
import keras
import strategykit as sk
from multi_worker_model import build_model, training_data

strategy = sk.from_env()
x, y = training_data()
with strategy.scope():
    model = build_model()
# As on two machines with local disks: the chief's backup_dir holds a backup, worker 1's
# (another disk, the same path) holds none.
backup_dir = f"{sys.argv[1]}/disk-{os.environ['STRATEGYKIT_WORKER']}"
try:  # Keras's own callback: refused before a step (each worker would write in place)
    model.fit(sk.shard((x, y), strategy, global_batch_size=16), epochs=1, verbose=0,
              callbacks=[keras.callbacks.BackupAndRestore(backup_dir)])
except ValueError as error:
    print(error, file=sys.stderr)
model.fit(sk.shard((x, y), strategy, global_batch_size=16), epochs=4, verbose=0,
          shuffle=False, callbacks=[sk.callbacks.BackupAndRestore(backup_dir)])
"""


def test_workers_that_cannot_read_the_chiefs_backup_fail_at_once(tmp_path):
    model = build_model()
    x, y = training_data()
    model.fit(x, y, batch_size=16, epochs=2, verbose=0, callbacks=[
        sk.callbacks.BackupAndRestore(tmp_path / "disk-0", delete_checkpoint=False)])
    finished = run_workers(_UNSHARED_BACKUP, 2, args=[tmp_path], tmp_path=tmp_path,
                           check=False)
    for worker in finished:
        assert worker.returncode != 0
        assert ("keras.callbacks.BackupAndRestore writes its backup in place from every "
                "worker") in worker.stderr, worker.stderr[-3000:]
        assert ("The workers resumed from different backups: worker 0 at epoch 2, worker 1 "
                "at epoch 0.") in worker.stderr, worker.stderr[-3000:]


_REDUCE = """
import json
import tensorflow as tf
import strategykit as sk

strategy = sk.from_env()
values = strategy.run(lambda: tf.cast(
    tf.distribute.get_replica_context().replica_id_in_sync_group + 1, tf.float32) * [10.0, 1.0])
print(json.dumps({op: sk.reduce(values, strategy, op).numpy().tolist()
                  for op in ("mean", "sum", "min", "max", "std")}))
"""


def test_reduce_covers_every_replica_of_the_job(tmp_path):
    # Replica k holds (k + 1) * [10, 1]: 3 workers, 1 replica each.
    for worker in run_workers(_REDUCE, 3, tmp_path=tmp_path):
        reduced = worker.last_json()
        np.testing.assert_allclose(reduced["mean"], [20.0, 2.0])
        np.testing.assert_allclose(reduced["sum"], [60.0, 6.0])
        np.testing.assert_allclose(reduced["min"], [10.0, 1.0])
        np.testing.assert_allclose(reduced["max"], [30.0, 3.0])
        np.testing.assert_allclose(reduced["std"], np.std([[10, 1], [20, 2], [30, 3]], axis=0),
                                   rtol=1e-6)
