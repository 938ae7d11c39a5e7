"""`sk.callbacks.BackupAndRestore` against a real kill: a process SIGKILLed while it writes
a backup (half a weights file on disk) is run again, resumes from the backup before, and
ends with the weights of an uninterrupted run (float64, bit for bit; 90 examples, so
each epoch ends on a partial batch). A kill between the seal and the publishing rename
is tested in-process (test_callbacks_backup). The same backup with its weights file
deleted is refused by the process resuming from it, naming the file. The killed run's
lock file stays, and locks nothing: the system freed the lock with the process, and the
next run takes `backup_dir` over (`backup_lock`)."""

import os
import shutil

import numpy as np
import pytest

TRAIN = """
import os, signal
import numpy as np
import keras
import strategykit as sk

kill_at, backup_dir, out = os.environ["KILL_AT"], os.environ["BACKUP_DIR"], os.environ["OUT"]
epochs_begun = []

def kill():
    os.kill(os.getpid(), signal.SIGKILL)

if kill_at == "weights":  # half of epoch 3's weights file on disk, then killed
    save_weights = keras.Model.save_weights
    def save_then_die(model, filepath, *args, **kwargs):
        save_weights(model, filepath, *args, **kwargs)
        if len(epochs_begun) == 3:
            with open(filepath, "r+b") as file:
                file.truncate(os.path.getsize(filepath) // 2)
            kill()
    keras.Model.save_weights = save_then_die

class Begun(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        epochs_begun.append(epoch)

keras.utils.set_random_seed(1)
strategy = sk.mirrored(replicas=2)
rng = np.random.default_rng(3)
x = rng.normal(size=(90, 3))  # 90 examples: a partial final batch of 10 over 16
y = x @ np.array([[1.0], [-2.0], [0.5]]) + 1
keras.config.set_floatx("float64")
with strategy.scope():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="tanh"),
                              keras.layers.Dense(1)])
    model.compile(keras.optimizers.Adam(0.05), "mse")
data = sk.shard((x, y), strategy, global_batch_size=16, shuffle=True, seed=7)
model.fit(data, epochs=5, verbose=0, callbacks=[
    Begun(), sk.callbacks.BackupAndRestore(backup_dir)])
print("EPOCHS", epochs_begun)
np.save(out, np.concatenate([w.ravel() for w in model.get_weights()]))
"""


def _train(run_python, kill_at, backup_dir, out):
    return run_python(TRAIN, check=False, timeout=120, env={
        "KILL_AT": kill_at, "BACKUP_DIR": str(backup_dir), "OUT": str(out)})


@pytest.mark.slow
def test_a_process_killed_while_backing_up_resumes_from_the_backup_before(run_python,
                                                                          tmp_path):
    whole = _train(run_python, "", tmp_path / "whole", tmp_path / "whole.npy")
    assert whole.returncode == 0, whole.stderr
    killed = _train(run_python, "weights", tmp_path / "b", tmp_path / "never.npy")
    assert killed.returncode == -9, killed.stderr  # SIGKILL, mid-backup
    assert not os.path.exists(tmp_path / "never.npy")
    assert sorted(os.listdir(tmp_path / "b")) == [  # epoch 2's, and the killed run's lock
        ".lock", ".writing", "backup-000001"]
    damaged = tmp_path / "damaged"
    shutil.copytree(tmp_path / "b", damaged)
    os.remove(damaged / "backup-000001" / "latest.weights.h5")
    refused = _train(run_python, "", damaged, tmp_path / "never.npy")
    assert refused.returncode == 1 and not os.path.exists(tmp_path / "never.npy")
    assert (f"The backup {damaged / 'backup-000001'} cannot be restored: its file "
            "latest.weights.h5 is missing.") in refused.stderr, refused.stderr
    resumed = _train(run_python, "", tmp_path / "b", tmp_path / "resumed.npy")
    assert resumed.returncode == 0, resumed.stderr
    assert "EPOCHS [2, 3, 4]" in resumed.stdout  # epoch 3 again, from epoch 2's backup
    np.testing.assert_array_equal(np.load(tmp_path / "resumed.npy"),
                                  np.load(tmp_path / "whole.npy"))
