"""One run at a time per `backup_dir` (`strategykit.callbacks.backup_lock`).

A second process starting `fit()` on the `backup_dir` of a run in progress is refused,
naming the run, and leaves its backups as they were; once the run has ended, its lock is
free, and a process forked while it was held keeps none of it. Tested elsewhere: a
SIGKILLed run's next run resumes in another process (test_backup_kill), a `fit()`
stopped by an exception is resumed by the same process (test_callbacks_backup), and a
worker that is not the chief takes no lock (tests/cluster/test_launch_resume.py, every
worker on one machine)."""

import fcntl
import os
import signal
import socket
import time

import keras
import numpy as np
import pytest

import strategykit as sk
from strategykit.callbacks import backup_lock

from conftest import cpu_devices

SECOND_RUN = """
import os
import numpy as np
import keras
import strategykit as sk

strategy = sk.mirrored(replicas=2)
with strategy.scope():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
x = np.ones((8, 3))
data = sk.shard((x, x[:, :1]), strategy, global_batch_size=4)
try:
    history = model.fit(data, epochs=3, verbose=0, callbacks=[
        sk.callbacks.BackupAndRestore(os.environ["BACKUP_DIR"], delete_checkpoint=False)])
except RuntimeError as error:
    print("REFUSED", error)
else:
    print("TRAINED epochs", history.epoch)
"""


def _fit(backup_dir, callbacks=(), epochs=3):
    strategy = sk.mirrored(cpu_devices(2))
    with strategy.scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        model.compile("sgd", "mse")
    x = np.random.default_rng(0).normal(size=(10, 3))  # a partial final batch
    data = sk.shard((x, x[:, :1]), strategy, global_batch_size=4)
    return model.fit(data, epochs=epochs, verbose=0, callbacks=[
        sk.callbacks.BackupAndRestore(backup_dir, delete_checkpoint=False), *callbacks])


def _listing(folder):
    return sorted((root, name, os.stat(os.path.join(root, name)).st_mtime_ns)
                  for root, _, names in os.walk(folder) for name in names)


def test_a_second_run_on_the_backup_dir_of_a_run_in_progress_is_refused(run_python, tmp_path):
    backup_dir = tmp_path / "backup"
    during = {}

    class SecondRun(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 1:  # after the backup of epoch 1 (the callback before this one)
                before = _listing(backup_dir)
                during["run"] = run_python(SECOND_RUN, env={"BACKUP_DIR": str(backup_dir)})
                during["unchanged"] = _listing(backup_dir) == before

    history = _fit(backup_dir, [SecondRun()])
    assert history.epoch == [0, 1, 2]  # the first run went on to its end
    output = during["run"].stdout
    assert output.startswith("REFUSED backup_dir is in use by another training run "
                             f"(pid {os.getpid()} on host {socket.gethostname()}, since "), output
    assert f"Received: backup_dir={str(backup_dir)!r}" in output
    assert "Wait for that run to end" in output and "a backup_dir of its own" in output
    assert during["unchanged"]  # nothing of the first run's backups touched

    _assert_free(backup_dir)  # ended, it freed the folder for the next run


def _assert_free(backup_dir):
    """No process holds `backup_dir`'s lock (flock raises BlockingIOError otherwise)."""
    descriptor = os.open(os.path.join(backup_dir, ".lock"), os.O_RDWR)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(descriptor)


def test_a_symbolic_link_as_the_lock_file_is_not_followed(tmp_path):
    backup_dir, target = tmp_path / "backup", tmp_path / "someone_elses_file"
    backup_dir.mkdir()
    target.write_text("kept")
    (backup_dir / ".lock").symlink_to(target)
    with pytest.raises(RuntimeError) as refused:
        _fit(backup_dir)
    assert str(refused.value) == (
        f"BackupAndRestore cannot open its lock file {backup_dir / '.lock'} (Too many "
        "levels of symbolic links); it never follows a symbolic link there. Received: "
        f"backup_dir={str(backup_dir)!r}. Delete {backup_dir / '.lock'} (strategykit makes "
        "it anew), or give this run a backup_dir of its own.")
    assert target.read_text() == "kept"


def test_a_file_system_without_locks_is_warned_of_and_training_goes_on(tmp_path, monkeypatch):
    class NoLocks:
        LOCK_EX, LOCK_NB = 2, 4

        @staticmethod
        def flock(descriptor, operation):
            raise OSError(37, "No locks available")

    monkeypatch.setattr(backup_lock, "fcntl", NoLocks)
    with pytest.warns(UserWarning, match=r"cannot lock .*\.lock \(No locks available: the "
                                         r"file system offers no locks\)"):
        history = _fit(tmp_path / "backup", epochs=2)
    assert history.epoch == [0, 1]
    assert (tmp_path / "backup" / "backup-000001").is_dir()


def test_a_process_forked_while_the_lock_is_held_does_not_keep_it(tmp_path):
    # A data loader's worker forked during fit(), still alive after fit() ends
    backup_lock.acquire(str(tmp_path))
    started, tell = os.pipe()
    child = os.fork()
    if child == 0:  # os.fork() returns here after the fork hooks ran
        os.write(tell, b"x")
        time.sleep(30)
        os._exit(0)
    try:
        assert os.read(started, 1) == b"x"
        backup_lock.release(str(tmp_path))
        _assert_free(tmp_path)  # the child's copy of the descriptor was closed
    finally:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
        os.close(started)
        os.close(tell)
