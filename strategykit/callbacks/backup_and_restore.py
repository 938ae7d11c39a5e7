"""`BackupAndRestore`: Keras's fault-tolerance callback, safe across workers and kills.

Keras's `keras.callbacks.BackupAndRestore` writes its backup (`latest.weights.h5` and
`training_metadata.json`) in place: every worker of a job writes the same files (and
each one's `makedirs` races the others' into a `FileExistsError`), and a process killed
while it writes leaves a torn backup that the next start may load. This one keeps
Keras's arguments and Keras's own save and restore code, and changes where they write:

* Each backup is written into `backup_dir/.writing` and then renamed, in one atomic
  step, to `backup_dir/backup-<n>`; a restore reads the newest complete `backup-<n>`.
  A kill at any moment leaves the previous backup whole.
* Only the chief writes `backup_dir`. The other workers do the same work into a scratch
  directory of their own (`strategykit.cluster.chief_files`), so every worker takes part
  in the same steps, and restore from `backup_dir` as the chief does.
* Each backup records the number of replicas and workers that wrote it
  (`strategykit.json`), so a resume on another number can say when it cannot be exact.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import warnings

import keras

from strategykit.callbacks import backup_lock
from strategykit.callbacks.backup_integrity import PRIVATE_DIR, problem_of, seal, sync_directory
from strategykit.callbacks.backup_record import (
    read_record,
    record_of,
    resume_window,
    window_of,
    write_record,
    write_window,
)
from strategykit.callbacks.backup_resume import (
    check_every_worker_restored,
    check_mid_epoch_resume,
    mid_epoch_obstacle,
    warn_if_inexact,
)
from strategykit.callbacks.preemption import Preemption
from strategykit.cluster.chief_files import writable_path
from strategykit.cluster.roles import is_chief, is_multi_worker
from strategykit.data import position
from strategykit.data.sharding import global_batch_size_of
from strategykit.launcher.worker_contract import PREEMPTED
from strategykit.pinning.legacy_keras import check_not_keras_2
from strategykit.upstream.keras_batches import last_data

_BACKUP = re.compile(r"^backup-(\d+)$")
_WRITING = ".writing"
_METADATA = "training_metadata.json"  # what Keras's BackupAndRestore writes and reads
_WEIGHTS = "latest.weights.h5"  # Keras's file name
_RAN_OUT = "Your input ran out of data"  # Keras, at the end of a resumed (shorter) epoch


class BackupAndRestore(keras.callbacks.Callback):
    """Backs up training at every epoch end and resumes from it after an interruption.

    Use it like `keras.callbacks.BackupAndRestore`: when a job dies (a killed worker, a
    preempted machine) and is started again with the same `backup_dir`, `fit()` restores
    the weights, the optimizer's state and the epoch count of the last backup and goes
    on from the epoch after it: nothing done again, nothing lost. With several workers
    (`sk.from_env()`, `strategykit launch --restarts K`) the chief alone writes
    `backup_dir`, and every worker must be able to read it: on several machines put it
    on a disk they share.

    A backup written by N workers (or replicas) resumes on any other number M, through
    `strategykit launch --workers M` or a plain run: keep the global batch
    (`sk.shard(..., global_batch_size=...)`) and the arithmetic of a step is the same,
    so training goes on exactly as it would have. Only batch norm that is not
    synchronized normalizes over each replica's share of the global batch, which then
    changes: resuming such a model on another number of replicas warns once, naming the
    layers (`sk.convert_sync_batchnorm` makes them exact).

    **Preemption.** SIGTERM (or SIGHUP: a closed terminal, a dropped ssh session) to
    any worker (or to `strategykit launch`) during `fit()`
    makes every worker stop after the same step: the chief writes a backup of that
    step, mid-epoch, and every worker exits with code 42 (`EXIT_CODE`:
    `strategykit.launcher.worker_contract.PREEMPTED`). Running the same command again
    (or `strategykit launch --restarts K`) resumes at the next step of that epoch,
    nothing redone or skipped; backups of `save_freq=N` resume the same way. With
    `sk.shard` data the resumed epoch's pass starts at that step, and
    `sk.shard(..., shuffle=True, seed=s)` orders each epoch as an uninterrupted run
    does, so training ends with the weights of an uninterrupted run. Keras's logs of
    the resumed epoch cover the steps after the resume.

    A backup is published atomically (written aside, then renamed), so a process killed
    while writing it leaves the previous backup intact. Each backup is sealed last by an
    integrity record (`integrity.json`: the size and sha256 of each of its files), and a
    backup that fails it on restore (a file missing, truncated or changed, torn JSON, no
    record) is never loaded: with `double_checkpoint=True` the backup before it is
    restored, with a warning naming the file and what is wrong; otherwise `fit()`
    raises, naming them and the fix. Backups written by an older strategykit, without a
    record, are refused the same way (delete them to start afresh). Backups are private:
    folders 0700, files 0600, and `backup_dir` 0700 when strategykit makes it. One run
    at a time writes a `backup_dir`: its chief locks `backup_dir/.lock` for the length
    of `fit()` (`backup_lock`; a killed run frees it at once), and a second run is
    refused, naming the first. An epoch-
    end backup resumes on any data and global batch size. A backup from the middle of an
    epoch (SIGTERM, `save_freq=N`) resumes only on `sk.shard` data of the same global
    batch size and steps per epoch, whose pass starts at the next step in the same order
    (unshuffled, or shuffled with a seed); other data (arrays that Keras batches, a
    `tf.data.Dataset`) starts every epoch at its first batch, and would train the steps
    done twice: on it, and on a shuffle without a seed, `save_freq=N` backs up at epoch
    ends (warned of) and SIGTERM stops without a backup, to go on from the epoch's
    start.

    Args:
        backup_dir: the directory of the backups; give every worker the same path.
        save_freq: `"epoch"` (default) to back up at every epoch end, or an integer N
            to back up every N batches (on `sk.shard` data in a repeatable order; at
            epoch ends on other data).
        double_checkpoint: also keep the backup before the newest, to restore from
            when the newest cannot be read. Default False.
        delete_checkpoint: delete `backup_dir` when training ends normally. Default
            True.

    Raises:
        ValueError: `backup_dir` empty, not a path or an existing file, a `save_freq`
            that is neither `"epoch"` nor a positive integer, or (at `fit()`) a Keras 2
            model from tf_keras, no sound backup to restore, or a mid-epoch backup
            resumed on data that is not `sk.shard`'s, in a new order every pass (a
            shuffle without a seed, `sk.shard_tfds(..., shuffle=True)`), or of
            another global batch size or number of steps per epoch.
        RuntimeError: (at `fit()`) another run, in another process, is writing
            `backup_dir`; or its lock file cannot be opened (a symbolic link there).

    Warns:
        UserWarning: `save_freq=N` on data that is not `sk.shard`'s, or in a new order
            every pass (backing up at epoch ends instead); a file system without locks
            (a second run on `backup_dir` cannot be detected).

    Example:
        >>> import strategykit as sk
        >>> backup = sk.callbacks.BackupAndRestore("/tmp/run1-backup")
        >>> model.fit(data, epochs=20, callbacks=[backup])  # doctest: +SKIP
    """

    EXIT_CODE = PREEMPTED
    """The exit code of a worker that backed up and stopped on SIGTERM (42)."""

    def __init__(self, backup_dir, save_freq="epoch", double_checkpoint=False,
                 delete_checkpoint=True):
        super().__init__()
        if not backup_dir or not isinstance(backup_dir, (str, os.PathLike)):
            raise ValueError(
                f"backup_dir must name a directory. Received: backup_dir={backup_dir!r}. "
                "Pass e.g. backup_dir='/tmp/backup' (the same path on every worker).")
        self.backup_dir = os.fspath(backup_dir)
        if os.path.exists(self.backup_dir) and not os.path.isdir(self.backup_dir):
            raise ValueError(
                f"backup_dir names a file, not a directory. Received: backup_dir="
                f"{self.backup_dir!r}. Pass a directory's path (it is made if it does not "
                "exist), or move that file away.")
        if save_freq != "epoch" and (not isinstance(save_freq, int) or isinstance(
                save_freq, bool) or save_freq < 1):
            raise ValueError(
                f"save_freq must be 'epoch' or a positive number of batches. Received: "
                f"save_freq={save_freq!r}. Pass save_freq='epoch' (the default) or e.g. "
                "save_freq=100 to back up every 100 batches.")
        self.save_freq = save_freq
        self.double_checkpoint = double_checkpoint
        self.delete_checkpoint = delete_checkpoint
        keras.callbacks.BackupAndRestore(self.backup_dir, save_freq=save_freq)  # checks it
        self._writer = None
        self._short_epoch = None

    def set_model(self, model):
        check_not_keras_2(model, "model")  # fit() of a tf_keras model
        super().set_model(model)

    def on_train_begin(self, logs=None):
        strategy = self.model.distribute_strategy
        self._chief = is_chief(strategy)
        self._written_by = record_of(strategy)
        data = last_data(self.model)
        self._global_batch = global_batch_size_of(data)  # None: not sk.shard's
        self._obstacle = mid_epoch_obstacle(data)  # None: its pass starts at any step
        if self._chief:  # the writer of backup_dir: one run at a time
            if not os.path.isdir(self.backup_dir):
                os.makedirs(self.backup_dir, mode=PRIVATE_DIR)  # private: the backups are
                os.chmod(self.backup_dir, PRIVATE_DIR)
            backup_lock.acquire(self.backup_dir)
        epoch, step, backup = self._restore()
        if is_multi_worker(strategy):
            check_every_worker_restored(strategy, epoch, step, self.backup_dir)
        if backup and self._chief:
            warn_if_inexact(backup, self.model, self._written_by)
        writing = os.path.join(writable_path(self.backup_dir, strategy), _WRITING)
        shutil.rmtree(writing, ignore_errors=True)  # torn by an earlier kill
        self._writer = keras.callbacks.BackupAndRestore(
            writing, save_freq=self._save_freq_of_this_data(), delete_checkpoint=False)
        self._writer.set_model(self.model)
        self._epoch, self._skipped, self._steps = epoch, step, 0
        if step:  # resumed in the middle of an epoch: its pass starts after that step
            position.skip_steps(step)
            self._short_epoch = _ignore_warning(_RAN_OUT)
        self._preemption = Preemption(strategy)
        self._preemption.start()

    def _save_freq_of_this_data(self):
        """`save_freq`, or "epoch" (warned of) for data that cannot resume mid-epoch."""
        if self.save_freq == "epoch" or self._obstacle is None:
            return self.save_freq
        reason, fix = self._obstacle
        warnings.warn(
            f"BackupAndRestore(save_freq={self.save_freq}) backs up in the middle of an "
            f"epoch only on data whose pass can start at any step, and {reason}: a resume "
            "from the middle of an epoch would train some of its examples twice. Backing "
            f"up at each epoch's end instead. For a backup every {self.save_freq} batches, "
            f"{fix}.", stacklevel=3)
        return "epoch"

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_epoch_end(self, epoch, logs=None):
        self._writer.on_epoch_end(epoch, logs)
        self._publish()
        self._skipped = 0
        _stop_ignoring(self._short_epoch)
        self._short_epoch = None

    def on_train_batch_end(self, batch, logs=None):
        step = self._skipped + batch + 1
        self._writer.on_train_batch_end(batch, logs)
        if os.path.isdir(self._writer.backup_dir):  # it backed up (save_freq=N)
            self._publish(step=self._write_position(step))
        self._steps += 1
        if self._preemption.after_step(self._steps):
            self._back_up_and_exit(step)

    def on_train_end(self, logs=None):
        _stop_ignoring(self._short_epoch)
        self._short_epoch = None
        self._preemption.stop()
        if self.delete_checkpoint and self._chief:
            shutil.rmtree(self.backup_dir, ignore_errors=True)
        backup_lock.release(self.backup_dir)

    def _write_position(self, step: int) -> int:
        """Keras's metadata of a backup at `step` of the current epoch (resumed there).

        Returns:
            The step it records in that epoch (0 when the epoch's last step was done).
        """
        epoch = self._epoch
        if step == self.params.get("steps"):  # the epoch's last step: the next begins
            epoch, step = epoch + 1, 0
        with open(os.path.join(self._writer.backup_dir, _METADATA), "w") as file:
            json.dump({"epoch": epoch, "batch": step - 1}, file)
        return step

    def _back_up_and_exit(self, step: int) -> None:
        """Writes a backup at `step` of the current epoch, then exits (preemption).

        On data that cannot resume in the middle of an epoch only an epoch's last step is
        backed up: the job goes on from the start of the epoch (its last backup)."""
        written = self._obstacle is None or step == self.params.get("steps")
        if written:
            os.makedirs(self._writer.backup_dir, exist_ok=True)
            self.model.save_weights(os.path.join(self._writer.backup_dir, _WEIGHTS))
            self._publish(step=self._write_position(step))
        self._preemption.stop()
        if self._chief:
            name, epoch = self._preemption.signal_name, self._epoch + 1
            print(f"strategykit: {name}: backed up epoch {epoch}, step {step} to "
                  f"{self.backup_dir}; exiting with code {PREEMPTED}. Run the same command "
                  "again to go on from the next step." if written else
                  f"strategykit: {name}: stopped at epoch {epoch}, step {step}, not backed "
                  f"up: {self._obstacle[0]}. Exiting with code {PREEMPTED}. Run the same "
                  f"command again to go on from the start of epoch {epoch} (the backup of "
                  f"the epoch before; to resume at the next step, {self._obstacle[1]}).",
                  file=sys.stderr, flush=True)
        raise SystemExit(PREEMPTED)

    def backups(self) -> list[str]:
        """The complete backups in `backup_dir`, oldest first."""
        if not os.path.isdir(self.backup_dir):
            return []
        numbered = sorted((int(m.group(1)), name) for name in os.listdir(self.backup_dir)
                          if (m := _BACKUP.match(name)))
        return [os.path.join(self.backup_dir, name) for _, name in numbered]

    def _restore(self) -> tuple[int, int, str | None]:
        """Restores the newest backup that passes its integrity check (Keras's restore).

        A backup that fails it is never loaded: with `double_checkpoint=True` the one
        before it is restored instead, with a warning naming what is wrong.

        Returns:
            Its epoch, the steps of that epoch it holds, and its path; `(0, 0, None)`
            when there is none.

        Raises:
            ValueError: no backup to restore passes the check, or a backup from the
                middle of an epoch cannot resume on this data
                (`backup_resume.check_mid_epoch_resume`).
        """
        candidates = self.backups()[-2 if self.double_checkpoint else -1:]
        for attempt, backup in enumerate(reversed(candidates)):
            last = attempt == len(candidates) - 1
            problem = problem_of(backup)
            if problem is not None:
                self._refuse_or_warn(backup, *problem, last=last)
                continue
            record = read_record(backup)
            check_mid_epoch_resume(backup, record, steps_per_epoch=self.params.get("steps"),
                                   global_batch_size=self._global_batch,
                                   obstacle=self._obstacle)
            restorer = keras.callbacks.BackupAndRestore(backup, delete_checkpoint=False)
            restorer.set_model(self.model)
            try:
                restorer.on_train_begin()
            except OSError as error:  # sound bytes Keras cannot read: say which
                self._refuse_or_warn(backup, _WEIGHTS, f"not readable by Keras ({error})",
                                     last=last)
                continue
            resume_window(backup, self.model)  # gradient accumulation's, beyond Keras's
            with open(os.path.join(backup, _METADATA)) as file:
                epoch = int(json.load(file)["epoch"])
            return epoch, record.get("step", 0), backup
        return 0, 0, None

    def _refuse_or_warn(self, backup: str, name: str, wrong: str, *, last: bool) -> None:
        """Raises for an unsound `backup` that has none before it, else warns."""
        where = f"The backup {backup} cannot be restored: its file {name} is {wrong}."
        if not last:
            warnings.warn(f"{where} Restoring the backup before it instead "
                          "(double_checkpoint=True).", stacklevel=3)
            return
        raise ValueError(
            f"{where} Received: backup_dir={self.backup_dir!r}. strategykit never trains "
            "on at a backup's epoch from other weights. Restore that file from a copy of "
            f"the backup, or delete the folder {backup} to resume from the backup before "
            f"it (or, when there is none, delete {self.backup_dir} to start afresh).")

    def _publish(self, step: int = 0) -> None:
        """Turns a backup the writer just wrote into the newest one (chief) or drops it.

        `step`: the steps of the current epoch it holds (0: at an epoch's end)."""
        writing = self._writer.backup_dir
        if not os.path.isdir(writing):
            return
        window = window_of(self.model)  # on every worker: an all-reduce
        if not self._chief:
            shutil.rmtree(writing)
            return
        write_window(writing, window)
        write_record(writing, {**self._written_by, "step": step,
                               "steps_per_epoch": self.params.get("steps"),
                               "global_batch_size": self._global_batch})
        seal(writing)  # last: a backup with a sound record is a whole backup
        existing = self.backups()
        number = int(_BACKUP.match(os.path.basename(existing[-1])).group(1)) + 1 if (
            existing) else 0
        os.rename(writing, os.path.join(self.backup_dir, f"backup-{number:06d}"))
        sync_directory(self.backup_dir)
        for old in existing[:len(existing) - (1 if self.double_checkpoint else 0)]:
            shutil.rmtree(old, ignore_errors=True)


def _ignore_warning(message: str):
    """Ignores warnings starting with `message` until `_stop_ignoring` of the result."""
    warnings.filterwarnings("ignore", message=re.escape(message))
    return warnings.filters[0]


def _stop_ignoring(entry) -> None:
    if entry is not None and entry in warnings.filters:
        warnings.filters.remove(entry)
