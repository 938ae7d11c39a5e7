"""`sk.callbacks.BackupAndRestore`: a resumed run equals an uninterrupted one, and a
backup torn by a kill is never read. Across worker processes: tests/cluster/test_launch_resume.py.
"""

import functools
import json
import os
import re
import shutil
import signal
import warnings

import keras
import numpy as np
import pytest

import strategykit as sk
from strategykit.callbacks import preemption

from conftest import bn_regressor, cpu_devices, restorer

EPOCHS = 6


class _Interrupt(keras.callbacks.Callback):
    """Stops the process's training at the start of `epoch`, as a kill would."""

    def __init__(self, epoch):
        super().__init__()
        self.epoch = epoch

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == self.epoch:
            raise KeyboardInterrupt(f"interrupted at epoch {epoch}")


class _Epochs(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.seen = []

    def on_epoch_begin(self, epoch, logs=None):
        self.seen.append(epoch)


def _data(examples=64):
    rng = np.random.default_rng(3)
    x = rng.normal(size=(examples, 3)).astype("float32")
    return x, (x @ np.array([[1.0], [-2.0], [0.5]], "float32") + 1).astype("float32")


@functools.cache
def _model(replicas, sync_bn):
    """A `restorer` of the model `_fit` trains on `replicas` replicas: built, compiled and
    traced once per test process (tracing is most of a fit's cost here), reset to its
    initial state before each fit."""
    with sk.mirrored(cpu_devices(replicas)).scope():
        model = bn_regressor()
        if sync_bn:
            model = sk.convert_sync_batchnorm(model)
            # SGD: Adam would turn the rounding noise of the bias before the batch norm
            # (its exact gradient is 0) into steps of the full learning rate.
            optimizer = keras.optimizers.SGD(0.05, momentum=0.9)
        else:
            optimizer = keras.optimizers.Adam(0.01)
        model.compile(optimizer, "mse")  # both have state to restore
        optimizer.build(model.trainable_variables)
    return restorer(model)  # the step count and the moments: state a backup restores


def _fit(replicas, callbacks, epochs=EPOCHS, sync_bn=False, examples=64, seed=None,
         arrays=False, shuffle=None):
    """Trains `_model(replicas, sync_bn)` from its initial state, as a new model would, on
    `sk.shard` data (shuffled when there is a `seed`, or as `shuffle` says), or with
    `arrays` on the arrays themselves (Keras batches them).

    Returns:
        The model (shared: read it before the next `_fit`).
    """
    model = _model(replicas, sync_bn)()
    model._initial_epoch = None  # set by a restore; a fit that raised leaves it
    if arrays:
        x, y = _data(examples)
        model.fit(x, y, batch_size=16, shuffle=False, epochs=epochs, verbose=0,
                  callbacks=callbacks)
        return model
    data = sk.shard(_data(examples), model.distribute_strategy, global_batch_size=16,
                    shuffle=seed is not None if shuffle is None else shuffle, seed=seed)
    model.fit(data, epochs=epochs, verbose=0, callbacks=callbacks)
    return model


@functools.cache
def _uninterrupted(replicas, **run):
    """The weights after `_fit(**run)` on `replicas` replicas without callbacks.

    Computed once per run in a test process: several tests resume that same run.
    """
    return _fit(replicas, [], **run).get_weights()


def _assert_same_weights(model, reference_weights, tolerance=1e-6):
    for weights, expected in zip(model.get_weights(), reference_weights, strict=True):
        np.testing.assert_allclose(weights, expected, rtol=tolerance, atol=tolerance)


def test_resumes_after_the_last_completed_epoch(tmp_path):
    uninterrupted = _uninterrupted(2)
    backup = sk.callbacks.BackupAndRestore(tmp_path / "backup")
    with pytest.raises(KeyboardInterrupt):
        _fit(2, [backup, _Interrupt(3)])
    assert [os.path.basename(b) for b in backup.backups()] == ["backup-000002"]
    epochs = _Epochs()
    resumed = _fit(2, [sk.callbacks.BackupAndRestore(tmp_path / "backup"), epochs])
    assert epochs.seen == [3, 4, 5]  # epochs 0-2 not done again
    _assert_same_weights(resumed, uninterrupted)  # Adam's moments restored too
    assert not os.path.exists(tmp_path / "backup")  # delete_checkpoint=True


@pytest.mark.parametrize("written_on, resumed_on", [(4, 2), (1, 4)])
def test_a_backup_resumes_exactly_on_another_number_of_replicas(tmp_path, written_on,
                                                                resumed_on):
    # The same global batch of 16 on every number of replicas; synchronized batch norm
    # normalizes over all 16 whatever the split, so the steps' arithmetic is the same.
    uninterrupted = _uninterrupted(2, sync_bn=True)
    with pytest.raises(KeyboardInterrupt):
        _fit(written_on, [sk.callbacks.BackupAndRestore(tmp_path / "b"), _Interrupt(3)],
             sync_bn=True)
    epochs = _Epochs()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resumed = _fit(resumed_on, [sk.callbacks.BackupAndRestore(tmp_path / "b"), epochs],
                       sync_bn=True)
    assert _inexact(caught) == []  # nothing to warn about: the resume is exact
    assert epochs.seen == [3, 4, 5]
    _assert_same_weights(resumed, uninterrupted, tolerance=1e-5)


@pytest.fixture(scope="module")
def backup_of_two_epochs(tmp_path_factory):
    """A backup of a run on 1 replica interrupted at the start of epoch 2, written once
    for the tests that resume it (each on a copy: a finished resume deletes it). One
    replica and two: the other tests' models (`_model`), so no more are traced; the
    warning compares the two counts, whichever they are."""
    backup_dir = tmp_path_factory.mktemp("backup") / "b"
    with pytest.raises(KeyboardInterrupt):
        _fit(1, [sk.callbacks.BackupAndRestore(backup_dir), _Interrupt(2)])
    return backup_dir


def test_resuming_unsynchronized_batch_norm_on_other_replicas_warns_once(tmp_path,
                                                                           backup_of_two_epochs):
    shutil.copytree(backup_of_two_epochs, tmp_path / "b")
    with pytest.warns(UserWarning) as caught:
        _fit(2, [sk.callbacks.BackupAndRestore(tmp_path / "b")])
    inexact = _inexact(caught)
    assert len(inexact) == 1
    assert re.fullmatch(
        r"Resuming from .*backup-000001, written by 1 replica, on 2 replicas: the batch "
        r"norm layers \['batch_normalization(_\d+)?'\] are not synchronized, so each "
        r"normalizes over its replica's share of the global batch, now 1/2 instead of 1/1\. "
        r"Training goes on, but not exactly as the uninterrupted run would have\. For an "
        r"exact resume on any number of replicas, synchronize them: model = "
        r"sk\.convert_sync_batchnorm\(model\)\.", inexact[0]), inexact[0]


def test_resuming_on_the_same_replicas_does_not_warn(tmp_path, backup_of_two_epochs):
    shutil.copytree(backup_of_two_epochs, tmp_path / "b")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _fit(1, [sk.callbacks.BackupAndRestore(tmp_path / "b")])
    assert _inexact(caught) == []


def _inexact(caught) -> list[str]:
    """The messages of the caught warnings that say a resume is not exact."""
    return [str(w.message) for w in caught if "not synchronized" in str(w.message)]


def test_a_backup_torn_by_a_kill_is_never_read(tmp_path, monkeypatch):
    uninterrupted = _uninterrupted(2)
    save_weights = keras.Model.save_weights

    def killed_while_writing(model, filepath, *args, **kwargs):
        if epochs.seen[-1] == 3:  # the backup of epoch 3: half a file, then "killed"
            with open(filepath, "wb") as file:
                file.write(b"\x89HDF\r\n")
            raise KeyboardInterrupt("killed while writing the backup")
        return save_weights(model, filepath, *args, **kwargs)

    epochs = _Epochs()
    monkeypatch.setattr(keras.Model, "save_weights", killed_while_writing)
    with pytest.raises(KeyboardInterrupt):
        _fit(2, [epochs, sk.callbacks.BackupAndRestore(tmp_path / "backup")])
    monkeypatch.undo()
    assert os.path.isdir(tmp_path / "backup" / ".writing")  # the torn one, set aside
    epochs = _Epochs()
    resumed = _fit(2, [sk.callbacks.BackupAndRestore(tmp_path / "backup"), epochs])
    assert epochs.seen == [3, 4, 5]  # from the backup before: epoch 2's
    _assert_same_weights(resumed, uninterrupted)


def test_double_checkpoint_keeps_two_and_falls_back(tmp_path):
    backup = sk.callbacks.BackupAndRestore(tmp_path / "b", double_checkpoint=True,
                                           delete_checkpoint=False)
    _fit(1, [backup], epochs=3)
    newest, before = backup.backups()[::-1]
    assert [os.path.basename(b) for b in (before, newest)] == ["backup-000001", "backup-000002"]
    with open(os.path.join(newest, "latest.weights.h5"), "wb") as file:
        file.write(b"not a weights file")
    epochs = _Epochs()
    _fit(1, [sk.callbacks.BackupAndRestore(tmp_path / "b", double_checkpoint=True), epochs],
         epochs=3)
    assert epochs.seen == [2]  # the newest is unreadable: resumed from the one before


def test_save_freq_in_batches(tmp_path):
    backup = sk.callbacks.BackupAndRestore(tmp_path / "b", save_freq=3,
                                           delete_checkpoint=False)
    _fit(2, [backup], epochs=2)  # 4 batches an epoch: saved after batches 3, 6
    assert len(backup.backups()) == 1
    assert os.path.basename(backup.backups()[0]) == "backup-000001"


class _AtStep(keras.callbacks.Callback):
    """Acts at step `step` (1-based) of `epoch`: `_at(batch)` says when."""

    def __init__(self, epoch, step):
        super().__init__()
        self.epoch, self.step = epoch, step

    def on_epoch_begin(self, epoch, logs=None):
        self._now = epoch

    def _at(self, batch) -> bool:
        return (self._now, batch + 1) == (self.epoch, self.step)


class _Sigterm(_AtStep):
    """Sends this process SIGTERM during step `step` (1-based) of `epoch`, as a scheduler
    preempting it would."""

    def on_train_batch_begin(self, batch, logs=None):
        if self._at(batch):
            os.kill(os.getpid(), signal.SIGTERM)


class _Steps(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.seen = {}

    def on_train_batch_end(self, batch, logs=None):
        self.seen[self._epoch] = self.seen.get(self._epoch, 0) + 1

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch


def test_sigterm_backs_up_the_step_and_a_rerun_goes_on_from_the_next(tmp_path):
    # 96 examples, global batch 16: 6 steps an epoch, shuffled by a seed; sync BN, SGD
    # with momentum. SIGTERM during step 3 of epoch 1: back up after step 3, exit 42.
    run = dict(epochs=3, sync_bn=True, examples=96, seed=5)
    uninterrupted = _uninterrupted(2, **run)
    backup = sk.callbacks.BackupAndRestore(tmp_path / "b")
    with pytest.raises(SystemExit) as exited:
        _fit(2, [_Sigterm(epoch=1, step=3), backup], **run)
    assert exited.value.code == sk.callbacks.BackupAndRestore.EXIT_CODE == 42
    assert signal.getsignal(signal.SIGTERM) is not preemption._on_sigterm  # given back
    (written,) = backup.backups()
    with open(os.path.join(written, "strategykit.json")) as file:
        assert json.load(file)["step"] == 3
    steps = _Steps()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resumed = _fit(2, [sk.callbacks.BackupAndRestore(tmp_path / "b"), steps], **run)
    assert steps.seen == {1: 3, 2: 6}  # steps 4-6 of epoch 1, then epoch 2 whole
    assert not [w for w in caught if "ran out of data" in str(w.message)]
    _assert_same_weights(resumed, uninterrupted, tolerance=1e-5)


def test_a_save_freq_backup_resumes_at_the_next_step(tmp_path):
    # The sigterm test's run (3 epochs), so that their uninterrupted run is computed once.
    run = dict(epochs=3, sync_bn=True, examples=96, seed=5)
    uninterrupted = _uninterrupted(2, **run)
    with pytest.raises(KeyboardInterrupt):  # backed up after step 4 of epoch 0
        _fit(2, [sk.callbacks.BackupAndRestore(tmp_path / "b", save_freq=4),
                        _Interrupt(1)], **run)
    steps = _Steps()
    resumed = _fit(2, [sk.callbacks.BackupAndRestore(tmp_path / "b"), steps], **run)
    assert steps.seen == {0: 2, 1: 6, 2: 6}
    _assert_same_weights(resumed, uninterrupted, tolerance=1e-5)


@pytest.mark.parametrize("kwargs, message", [
    ({"backup_dir": ""}, r"backup_dir must name a directory. Received: backup_dir=''"),
    ({"backup_dir": "b", "save_freq": "batch"},
     r"save_freq must be 'epoch' or a positive number of batches. Received: "
     r"save_freq='batch'"),
])
def test_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        sk.callbacks.BackupAndRestore(**kwargs)


class _InterruptAfter(_AtStep):
    """Stops the process's training after step `step` (1-based) of `epoch`."""

    def on_train_batch_end(self, batch, logs=None):
        if self._at(batch):
            raise KeyboardInterrupt(f"interrupted after step {self.step} of epoch {self.epoch}")


# Arrays that Keras batches start every epoch at its first batch: a backup from the middle
# of an epoch would resume there with weights that trained its first steps already.


def test_save_freq_on_arrays_backs_up_at_epoch_ends_and_resumes_exactly(tmp_path):
    uninterrupted = _uninterrupted(2, arrays=True)
    with pytest.warns(UserWarning, match=(
            r"BackupAndRestore\(save_freq=2\) backs up in the middle of an epoch only on "
            r"data whose pass can start at any step, and this fit\(\)'s data is not "
            r"sk\.shard's: .* Backing up at each epoch's end instead\. For a backup every 2 "
            r"batches, pass sk\.shard\(data, strategy, global_batch_size=\.\.\.\) to "
            r"fit\(\)\.")):
        with pytest.raises(KeyboardInterrupt):  # 4 steps an epoch: after step 3 of epoch 1
            _fit(2, [sk.callbacks.BackupAndRestore(tmp_path / "b", save_freq=2),
                     _InterruptAfter(1, 3)], arrays=True)
    epochs = _Epochs()
    resumed = _fit(2, [sk.callbacks.BackupAndRestore(tmp_path / "b"), epochs], arrays=True)
    assert epochs.seen == [1, 2, 3, 4, 5]  # epoch 1 from its start, on epoch 0's weights
    _assert_same_weights(resumed, uninterrupted)


_NO_SEED = (r"this fit\(\)'s sk\.shard data is shuffled without a seed: every pass draws a "
            r"new order")


@pytest.mark.parametrize("resumed_on, reason", [
    ({"arrays": True}, r"this fit\(\)'s data is not sk\.shard's: it starts every epoch at "
                       r"its first batch"),
    ({"shuffle": True}, _NO_SEED),
], ids=["arrays", "shuffled_without_a_seed"])
def test_a_mid_epoch_backup_resumed_on_data_that_cannot_start_there_is_refused(
        tmp_path, resumed_on, reason):
    with pytest.raises(KeyboardInterrupt):  # sk.shard data: backed up after step 2 of epoch 1
        _fit(2, [sk.callbacks.BackupAndRestore(tmp_path / "b", save_freq=2),
                 _InterruptAfter(1, 3)])
    with pytest.raises(ValueError, match=(
            r"The backup .*backup-\d+ was written after step 2 of an epoch, and " + reason +
            r", so resuming there would train some of that epoch's examples twice and skip "
            r"others\. Received: a backup at step 2 of an epoch\. Resume on data whose pass "
            r"starts at that step, as the run that wrote it did \(pass sk\.shard\(.*\)\); or "
            r"delete that backup folder")):
        _fit(2, [sk.callbacks.BackupAndRestore(tmp_path / "b")], **resumed_on)


def test_save_freq_on_data_shuffled_without_a_seed_backs_up_at_epoch_ends(tmp_path):
    backup = sk.callbacks.BackupAndRestore(tmp_path / "b", save_freq=2)
    with pytest.warns(UserWarning, match=_NO_SEED + r": a resume from the middle of an epoch "
                      r".* pass sk\.shard\(\.\.\., shuffle=True, seed=<an int>\)"):
        with pytest.raises(KeyboardInterrupt):
            _fit(2, [backup, _InterruptAfter(1, 3)], shuffle=True)
    (written,) = backup.backups()
    with open(os.path.join(written, "strategykit.json")) as file:
        assert json.load(file)["step"] == 0  # the end of epoch 0, not step 2 of epoch 1


def test_sigterm_on_arrays_stops_without_a_mid_epoch_backup_and_resumes_exactly(tmp_path,
                                                                                  capfd):
    uninterrupted = _uninterrupted(2, arrays=True)
    backup = sk.callbacks.BackupAndRestore(tmp_path / "b")
    with pytest.raises(SystemExit) as exited:
        _fit(2, [_Sigterm(epoch=2, step=2), backup], arrays=True)
    assert exited.value.code == 42
    (written,) = backup.backups()
    with open(os.path.join(written, "strategykit.json")) as file:
        assert json.load(file)["step"] == 0  # the end of epoch 1 (0-based)
    assert re.search(r"SIGTERM: stopped at epoch 3, step 2, not backed up: this fit\(\)'s "
                     r"data is not sk\.shard's: .* go on from the start of epoch 3 \(the "
                     r"backup of the epoch before; to resume at the next step, pass sk\.shard",
                     capfd.readouterr().err)
    epochs = _Epochs()
    resumed = _fit(2, [sk.callbacks.BackupAndRestore(tmp_path / "b"), epochs], arrays=True)
    assert epochs.seen == [2, 3, 4, 5]
    _assert_same_weights(resumed, uninterrupted)


def _accumulating_fit(replicas, callbacks):
    """4 epochs of 3 steps with gradient_accumulation_steps=2 on `replicas` replicas, in
    float64: every other epoch ends inside an update window (its accumulators differ
    between the replicas: each adds its own gradients until the window's update)."""
    x, y = _data(48)
    strategy = sk.mirrored(cpu_devices(replicas))
    keras.utils.set_random_seed(1)
    with strategy.scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        model.compile(keras.optimizers.SGD(0.05, momentum=0.5, gradient_accumulation_steps=2),
                      "mse")
    model.fit(sk.shard((x, y), strategy, global_batch_size=16), epochs=4, verbose=0,
              callbacks=callbacks)
    return model


@pytest.mark.parametrize("resumed_on", [2, 4])
def test_a_backup_inside_an_accumulation_window_resumes_it_whole(tmp_path, float64,
                                                                  resumed_on):
    uninterrupted = _accumulating_fit(2, []).get_weights()
    backup = sk.callbacks.BackupAndRestore(tmp_path / "b")
    with pytest.raises(KeyboardInterrupt):  # after epoch 0: step 3, inside the 2nd window
        _accumulating_fit(2, [backup, _Interrupt(1)])
    (written,) = backup.backups()
    assert sorted(os.listdir(written)) == ["accumulation.npz", "integrity.json",
                                           "latest.weights.h5", "strategykit.json",
                                           "training_metadata.json"]
    epochs = _Epochs()
    resumed = _accumulating_fit(resumed_on, [sk.callbacks.BackupAndRestore(tmp_path / "b"),
                                             epochs])
    assert epochs.seen == [1, 2, 3]
    _assert_same_weights(resumed, uninterrupted, tolerance=1e-12)  # 3e-2 off with replica 0's
