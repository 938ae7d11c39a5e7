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
  directory of their own (`strategykit.cluster.chief_files`), so every worker takes part in the
  same steps, and restore from `backup_dir` as the chief does.
"""

from __future__ import annotations

import json
import os
import re
import shutil

import keras
import tensorflow as tf

from strategykit.cluster.chief_files import writable_path
from strategykit.cluster.roles import is_chief, is_multi_worker
from strategykit.strategy.reduction import every_replica

_BACKUP = re.compile(r"^backup-(\d+)$")
_WRITING = ".writing"
_METADATA = "training_metadata.json"  # what Keras's BackupAndRestore writes and reads


class BackupAndRestore(keras.callbacks.Callback):
    """Backs up training at every epoch end and resumes from it after an interruption.

    Use it like `keras.callbacks.BackupAndRestore`: when a job dies (a killed worker, a
    preempted machine) and is started again with the same `backup_dir`, `fit()` restores
    the weights, the optimizer's state and the epoch count of the last backup and goes
    on from the epoch after it: nothing done again, nothing lost. With several workers
    (`sk.from_env()`, `strategykit launch --restarts K`) the chief alone writes
    `backup_dir`, and every worker must be able to read it: on several machines put it
    on a disk they share.

    A backup is published atomically (written aside, then renamed), so a process killed
    while writing it leaves the previous backup intact. With `save_freq=N` a restore
    starts again at the beginning of the interrupted epoch, as Keras's does. The data
    each epoch sees is the input's: with `sk.shard(..., shuffle=True)` a resumed run's
    later epochs see other orders than an uninterrupted run's.

    Args:
        backup_dir: the directory of the backups; give every worker the same path.
        save_freq: `"epoch"` (default) to back up at every epoch end, or an integer N
            to back up every N batches.
        double_checkpoint: also keep the backup before the newest, to restore from
            when the newest cannot be read. Default False.
        delete_checkpoint: delete `backup_dir` when training ends normally. Default
            True.

    Raises:
        ValueError: an empty `backup_dir` or an invalid `save_freq`.

    Example:
        >>> import strategykit as sk
        >>> backup = sk.callbacks.BackupAndRestore("/tmp/run1-backup")
        >>> model.fit(data, epochs=20, callbacks=[backup])  # doctest: +SKIP
    """

    def __init__(self, backup_dir, save_freq="epoch", double_checkpoint=False,
                 delete_checkpoint=True):
        super().__init__()
        if not backup_dir:
            raise ValueError(
                f"backup_dir must name a directory. Received: backup_dir={backup_dir!r}. "
                "Pass e.g. backup_dir='/tmp/backup' (the same path on every worker).")
        self.backup_dir = os.fspath(backup_dir)
        self.save_freq = save_freq
        self.double_checkpoint = double_checkpoint
        self.delete_checkpoint = delete_checkpoint
        keras.callbacks.BackupAndRestore(self.backup_dir, save_freq=save_freq)  # checks it
        self._writer = None

    def on_train_begin(self, logs=None):
        strategy = self.model.distribute_strategy
        self._chief = is_chief(strategy)
        epoch = self._restore()
        if is_multi_worker(strategy):
            self._check_every_worker_restored(strategy, epoch)
        writing = os.path.join(writable_path(self.backup_dir, strategy), _WRITING)
        shutil.rmtree(writing, ignore_errors=True)  # torn by an earlier kill
        self._writer = keras.callbacks.BackupAndRestore(
            writing, save_freq=self.save_freq, delete_checkpoint=False)
        self._writer.set_model(self.model)

    def on_epoch_end(self, epoch, logs=None):
        self._writer.on_epoch_end(epoch, logs)
        self._publish()

    def on_train_batch_end(self, batch, logs=None):
        self._writer.on_train_batch_end(batch, logs)
        self._publish()

    def on_train_end(self, logs=None):
        if self.delete_checkpoint and self._chief:
            shutil.rmtree(self.backup_dir, ignore_errors=True)

    def backups(self) -> list[str]:
        """The complete backups in `backup_dir`, oldest first."""
        if not os.path.isdir(self.backup_dir):
            return []
        numbered = sorted((int(m.group(1)), name) for name in os.listdir(self.backup_dir)
                          if (m := _BACKUP.match(name)))
        return [os.path.join(self.backup_dir, name) for _, name in numbered]

    def _restore(self) -> int:
        """Restores the newest readable backup (Keras's own restore); returns its epoch."""
        candidates = self.backups()[-2 if self.double_checkpoint else -1:]
        for attempt, backup in enumerate(reversed(candidates)):
            restorer = keras.callbacks.BackupAndRestore(backup, delete_checkpoint=False)
            restorer.set_model(self.model)
            try:
                restorer.on_train_begin()
            except OSError:
                if attempt == len(candidates) - 1:
                    raise
                continue
            with open(os.path.join(backup, _METADATA)) as file:
                return int(json.load(file)["epoch"])
        return 0

    def _check_every_worker_restored(self, strategy, epoch: int) -> None:
        """Fails on every worker at once unless all restored the same epoch.

        A worker that cannot read the chief's `backup_dir` (no shared disk) would start
        from other weights and run other epochs, and the job would hang.
        """
        epochs = every_replica(tf.constant(epoch), strategy).numpy().tolist()
        if len(set(epochs)) > 1:
            by_worker = epochs[::len(strategy.extended.worker_devices)]
            resumed = ", ".join(f"worker {k} at epoch {e}" for k, e in enumerate(by_worker))
            raise ValueError(
                f"The workers resumed from different backups: {resumed}. Received: "
                f"backup_dir={self.backup_dir!r} on every worker. Every worker must read "
                "the chief's backups: on several machines put backup_dir on a disk they "
                "all share.")

    def _publish(self) -> None:
        """Turns a backup the writer just wrote into the newest one (chief) or drops it."""
        writing = self._writer.backup_dir
        if not os.path.isdir(writing):
            return
        if not self._chief:
            shutil.rmtree(writing)
            return
        existing = self.backups()
        number = int(_BACKUP.match(os.path.basename(existing[-1])).group(1)) + 1 if (
            existing) else 0
        os.rename(writing, os.path.join(self.backup_dir, f"backup-{number:06d}"))
        for old in existing[:len(existing) - (1 if self.double_checkpoint else 0)]:
            shutil.rmtree(old, ignore_errors=True)
