"""What a resume from a backup of `sk.callbacks.BackupAndRestore` checks before it trains.

A backup from the middle of an epoch holds the steps done of that epoch; it resumes only
where the same steps stand for the same examples: on `sk.shard` data (whose pass starts
at any step, `strategykit.data.position`) in an order that each pass repeats, of the
same global batch size and steps per epoch (`check_mid_epoch_resume`). Other data starts
every epoch at its first batch, so `fit()` would train those steps twice; a shuffle
without a seed, or TFDS's shuffled files, draw another order (`mid_epoch_obstacle` says
which). Every worker must have restored the same backup (`check_every_worker_restored`),
and unsynchronized batch norm resumed on another number of replicas is warned of
(`warn_if_inexact`).
"""

from __future__ import annotations

import warnings

import tensorflow as tf

from strategykit.batchnorm.unsynchronized import unsynchronized_batch_norms
from strategykit.callbacks.backup_record import read_record, replicas_text
from strategykit.data.sharding import global_batch_size_of, new_order_every_pass
from strategykit.strategy.reduction import every_replica

_OR_DELETE = ("or delete that backup folder to go on from the backup before it, or afresh "
              "without one.")


def mid_epoch_obstacle(dataset) -> tuple[str, str] | None:
    """Why `fit()` on `dataset` cannot go on from the middle of an epoch, and the fix, for
    messages; None when it can (`sk.shard` data whose every pass is in the same order).

    Example:
        >>> mid_epoch_obstacle(None)[0]
        "this fit()'s data is not sk.shard's: it starts every epoch at its first batch"
    """
    if global_batch_size_of(dataset) is None:
        return ("this fit()'s data is not sk.shard's: it starts every epoch at its first "
                "batch", "pass sk.shard(data, strategy, global_batch_size=...) to fit()")
    new_order = new_order_every_pass(dataset)
    if new_order is None:
        return None
    why, fix = new_order
    return f"this fit()'s sk.shard data {why}", fix


def check_mid_epoch_resume(backup: str, record: dict, *, steps_per_epoch: int | None,
                           global_batch_size: int | None,
                           obstacle: tuple[str, str] | None) -> None:
    """Refuses to resume from the middle of an epoch where the steps done would stand for
    other examples than those trained on.

    Args:
        backup: the backup's folder, for messages.
        record: what it records (`backup_record.read_record`).
        steps_per_epoch: the steps of an epoch of this `fit()` (Keras's `params["steps"]`),
            None when unknown.
        global_batch_size: the global batch size of this `fit()`'s `sk.shard` data; None
            for data that `sk.shard` did not make.
        obstacle: `mid_epoch_obstacle` of this `fit()`'s data.

    Raises:
        ValueError: a backup from the middle of an epoch resumed on data that cannot
            start there (`obstacle`), or of another global batch size, or with another
            number of steps per epoch.
    """
    step = record.get("step")
    if not step:
        return  # at an epoch's end: any data and batch go on from the next epoch
    if obstacle is not None:
        reason, fix = obstacle
        raise ValueError(
            f"The backup {backup} was written after step {step} of an epoch, and {reason}, "
            "so resuming there would train some of that epoch's examples twice and skip "
            f"others. Received: a backup at step {step} of an epoch. Resume on data whose "
            f"pass starts at that step, as the run that wrote it did ({fix}); "
            + _OR_DELETE)
    then = record.get("global_batch_size")
    if then is not None and then != global_batch_size:
        raise ValueError(
            f"The backup {backup} was written after step {step} of an epoch with "
            f"global_batch_size={then}, and this fit()'s sk.shard data has "
            f"global_batch_size={global_batch_size}: resuming would skip "
            f"{step * global_batch_size} examples of the epoch instead of the {step * then} "
            f"done. Received: global_batch_size={then} then, {global_batch_size} now. "
            f"Resume with sk.shard(..., global_batch_size={then}) until the epoch ends "
            "(backups at an epoch's end resume with any size); " + _OR_DELETE)
    then = record.get("steps_per_epoch")
    if then is None or steps_per_epoch is None or then == steps_per_epoch:
        return
    raise ValueError(
        f"The backup {backup} was written after step {step} of {then} of an epoch, and an "
        f"epoch now has {steps_per_epoch} steps: the data or its global batch size changed, "
        f"so the {step} steps done stand for other examples than {step} steps now. "
        f"Received: {then} steps an epoch then, {steps_per_epoch} now. Resume with the "
        "data and global batch size of the run that wrote it (sk.shard(..., "
        "global_batch_size=<that size>)); " + _OR_DELETE)


def warn_if_inexact(backup: str, model, written_by: dict) -> None:
    """Warns when `backup` was written by another number of replicas than `written_by`
    (this run's `backup_record.record_of`) and `model` has batch norm that is not
    synchronized (its per-replica batch has changed)."""
    then = read_record(backup)
    if not then:  # written before backups recorded it
        return
    layers = unsynchronized_batch_norms(model)
    if then["replicas"] == written_by["replicas"] or not layers:
        return
    warnings.warn(
        f"Resuming from {backup}, written by {replicas_text(then)}, on "
        f"{replicas_text(written_by)}: the batch norm layers {layers} are not synchronized, "
        f"so each normalizes over its replica's share of the global batch, now 1/"
        f"{written_by['replicas']} instead of 1/{then['replicas']}. Training goes on, but "
        "not exactly as the uninterrupted run would have. For an exact resume on any number "
        "of replicas, synchronize them: model = sk.convert_sync_batchnorm(model).",
        stacklevel=3)


def check_every_worker_restored(strategy, epoch: int, step: int, backup_dir: str) -> None:
    """Fails on every worker at once unless all restored the same epoch and step.

    A worker that cannot read the chief's `backup_dir` (no shared disk) would start
    from other weights and run other epochs, and the job would hang.

    Raises:
        ValueError: the workers restored different epochs or steps.
    """
    position = epoch * 1_000_000 + step
    positions = every_replica(tf.constant(position, tf.int64), strategy).numpy().tolist()
    if len(set(positions)) == 1:
        return
    try:  # every worker has the positions once all are here: none exits before
        every_replica(tf.constant(0, tf.int64), strategy)
    except tf.errors.OpError:  # a worker past this point raised and exited already
        pass
    by_worker = positions[::len(strategy.extended.worker_devices)]
    resumed = ", ".join(
        f"worker {k} at epoch {p // 1_000_000}" + (f", step {p % 1_000_000}" * bool(
            p % 1_000_000)) for k, p in enumerate(by_worker))
    raise ValueError(
        f"The workers resumed from different backups: {resumed}. Received: "
        f"backup_dir={backup_dir!r} on every worker. Every worker must read "
        "the chief's backups: on several machines put backup_dir on a disk they "
        "all share.")
