"""`sk.callbacks.BackupAndRestore`: a backup whose files are not those written is never
loaded (integrity record), backups are private, SIGHUP backs up as SIGTERM does, and a
mid-epoch resume with another batch size is refused."""

import os
import signal
import stat

import h5py
import pytest
from test_callbacks_backup import (
    _assert_same_weights,
    _Epochs,
    _fit,
    _model,
    _Sigterm,
    _uninterrupted,
)

import strategykit as sk
from strategykit.callbacks import preemption


@pytest.fixture(scope="module")
def three_epochs(tmp_path_factory):
    """Backups of epochs 1 and 2 of a 3-epoch run on 1 replica (double_checkpoint)."""
    backup_dir = tmp_path_factory.mktemp("integrity") / "b"
    backup = sk.callbacks.BackupAndRestore(backup_dir, double_checkpoint=True,
                                           delete_checkpoint=False)
    _fit(1, [backup], epochs=3)
    return backup_dir


def _copy(source, target):
    import shutil
    shutil.copytree(source, target)
    return sorted(str(p) for p in target.glob("backup-*"))[-1]  # the newest


def _flip_a_weight(path):
    with h5py.File(path, "r+") as file:
        datasets = []
        file.visititems(lambda name, item: datasets.append(item) if isinstance(
            item, h5py.Dataset) and item.size else None)
        values = datasets[0][...]
        values.flat[0] += 1.0
        datasets[0][...] = values


def _truncate(path):
    with open(path, "r+b") as file:
        file.truncate(os.path.getsize(path) // 2)


def _tear(path):
    with open(path, "r+b") as file:
        file.truncate(os.path.getsize(path) - 3)


DAMAGES = {
    "missing weights": ("latest.weights.h5", os.remove, r"latest\.weights\.h5 is missing"),
    "one weight changed": ("latest.weights.h5", _flip_a_weight,
                           r"latest\.weights\.h5 is changed: its bytes are not those written"),
    "truncated h5": ("latest.weights.h5", _truncate,
                     r"latest\.weights\.h5 is \d+ bytes instead of the \d+ written "
                     r"\(truncated\)"),
    "torn metadata": ("training_metadata.json", _tear,
                      r"training_metadata\.json is \d+ bytes instead"),
    "torn record": ("strategykit.json", _tear, r"strategykit\.json is \d+ bytes instead"),
    "no integrity record": ("integrity.json", os.remove,
                            r"integrity\.json is missing: the backup has no integrity record"),
}


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_backup_is_refused_naming_it_the_file_and_the_fix(tmp_path, three_epochs,
                                                                    damage):
    name, damaging, wrong = DAMAGES[damage]
    newest = _copy(three_epochs, tmp_path / "b")
    damaging(os.path.join(newest, name))
    epochs = _Epochs()
    with pytest.raises(ValueError, match=(
            rf"The backup {newest} cannot be restored: its file {wrong}.*Received: "
            rf"backup_dir='{tmp_path / 'b'}'\. strategykit never trains on at a backup's "
            rf"epoch from other weights\. Restore that file from a copy of the backup, or "
            rf"delete the folder {newest} to resume")):
        _fit(1, [sk.callbacks.BackupAndRestore(tmp_path / "b"), epochs], epochs=3)
    assert epochs.seen == []  # not one step trained


def test_torn_json_with_a_record_that_matches_it_is_refused(tmp_path, three_epochs):
    # Torn before it was sealed (a record then made of the torn bytes): still refused.
    from strategykit.callbacks.backup_integrity import seal
    newest = _copy(three_epochs, tmp_path / "b")
    os.remove(os.path.join(newest, "integrity.json"))
    _tear(os.path.join(newest, "training_metadata.json"))
    seal(newest)
    with pytest.raises(ValueError, match=r"its file training_metadata\.json is torn JSON"):
        _fit(1, [sk.callbacks.BackupAndRestore(tmp_path / "b")], epochs=3)


def test_double_checkpoint_falls_back_past_a_missing_weights_file_with_a_warning(
        tmp_path, three_epochs):
    uninterrupted = _uninterrupted(1, epochs=3)
    newest = _copy(three_epochs, tmp_path / "b")
    os.remove(os.path.join(newest, "latest.weights.h5"))
    epochs = _Epochs()
    with pytest.warns(UserWarning, match=(
            rf"The backup {newest} cannot be restored: its file latest\.weights\.h5 is "
            r"missing\. Restoring the backup before it instead \(double_checkpoint=True\)")):
        resumed = _fit(1, [sk.callbacks.BackupAndRestore(tmp_path / "b",
                                                         double_checkpoint=True), epochs],
                       epochs=3)
    assert epochs.seen == [2]  # from epoch 1's backup: epoch 2 trained again, not skipped
    _assert_same_weights(resumed, uninterrupted)


def test_backups_are_private(tmp_path, three_epochs):
    newest = _copy(three_epochs, tmp_path / "c")
    assert stat.S_IMODE(os.stat(three_epochs).st_mode) == 0o700  # made by strategykit
    for backup in (newest, *three_epochs.glob("backup-*")):
        assert stat.S_IMODE(os.stat(backup).st_mode) == 0o700
        for file in os.listdir(backup):
            assert stat.S_IMODE(os.stat(os.path.join(backup, file)).st_mode) == 0o600, file


def test_sighup_backs_up_and_stops_like_sigterm(tmp_path):
    run = dict(epochs=3, sync_bn=True, examples=96, seed=5)
    before = signal.getsignal(signal.SIGHUP)
    backup = sk.callbacks.BackupAndRestore(tmp_path / "b")

    class Sighup(_Sigterm):
        def on_train_batch_begin(self, batch, logs=None):
            if (self._now, batch + 1) == (self.epoch, self.step):
                os.kill(os.getpid(), signal.SIGHUP)

    with pytest.raises(SystemExit) as exited:
        _fit(2, [Sighup(epoch=1, step=3), backup], **run)
    assert exited.value.code == 42
    assert signal.getsignal(signal.SIGHUP) is before is not preemption._on_sigterm
    assert len(backup.backups()) == 1
    # and a mid-epoch resume with another global batch is refused, naming both counts
    model = _model(2, True)()
    model._initial_epoch = None
    data = sk.shard(_data96(), model.distribute_strategy, global_batch_size=32,
                    shuffle=True, seed=5)
    with pytest.raises(ValueError, match=(
            r"after step 3 of an epoch with global_batch_size=16, and this fit\(\)'s "
            r"sk\.shard data has global_batch_size=32: resuming would skip 96 examples of "
            r"the epoch instead of the 48 done\. Received: global_batch_size=16 then, 32 "
            r"now\. Resume with sk\.shard\(\.\.\., global_batch_size=16\)")):
        model.fit(data, epochs=3, verbose=0,
                  callbacks=[sk.callbacks.BackupAndRestore(tmp_path / "b")])


def test_a_mid_epoch_resume_with_another_batch_of_the_same_steps_is_refused(tmp_path):
    """96 examples make 6 steps of 16 and 6 of 18: the steps agree, the examples done do
    not (3 steps of 16 are 48 examples, of 18 would be 54)."""
    backup = sk.callbacks.BackupAndRestore(tmp_path / "b")
    with pytest.raises(SystemExit):
        _fit(2, [_Sigterm(epoch=0, step=3), backup], epochs=2, examples=96, seed=5)
    model = _model(2, False)()
    model._initial_epoch = None
    data = sk.shard(_data96(), model.distribute_strategy, global_batch_size=18,
                    shuffle=True, seed=5)
    epochs = _Epochs()
    with pytest.raises(ValueError, match=(
            r"global_batch_size=16, and this fit\(\)'s sk\.shard data has "
            r"global_batch_size=18: resuming would skip 54 examples of the epoch instead "
            r"of the 48 done")):
        model.fit(data, epochs=2, verbose=0, callbacks=[
            sk.callbacks.BackupAndRestore(tmp_path / "b"), epochs])
    assert epochs.seen == []  # refused before any epoch trained
    assert sorted(os.listdir(tmp_path / "b")) == [".lock", "backup-000000"]  # the backup kept


def _data96():
    from test_callbacks_backup import _data
    return _data(96)


@pytest.mark.parametrize("save_freq", [0, -3, True, 2.5])
def test_a_save_freq_that_is_no_positive_count_is_refused(save_freq):
    with pytest.raises(ValueError, match=(
            rf"save_freq must be 'epoch' or a positive number of batches\. Received: "
            rf"save_freq={save_freq!r}\. Pass save_freq='epoch'")):
        sk.callbacks.BackupAndRestore("b", save_freq=save_freq)


def test_a_backup_dir_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "f").write_text("")
    with pytest.raises(ValueError, match=(
            rf"backup_dir names a file, not a directory\. Received: backup_dir="
            rf"'{tmp_path / 'f'}'\. Pass a directory's path")):
        sk.callbacks.BackupAndRestore(tmp_path / "f")
