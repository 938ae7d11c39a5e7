"""`CrossReplicaLoss`: every replica's loss, its reductions and a NaN guard, in `logs`."""

from __future__ import annotations

import warnings

import keras
import numpy as np

from strategykit.callbacks import nan_guard, replica_drift
from strategykit.callbacks.progress import ProgressDisplay, check_progress, shown_keys
from strategykit.callbacks.step_hooks import StepHooks
from strategykit.cluster.roles import is_multi_worker
from strategykit.pinning.legacy_keras import check_not_keras_2
from strategykit.strategy.reduction import REDUCE_OPS, reduce_stacked

DEFAULT_REDUCTIONS = ("mean", "min", "max", "std")


class CrossReplicaLoss(keras.callbacks.ProgbarLogger):
    """Puts each replica's loss and their reductions into `logs`, and guards against NaN.

    Add it to `fit(callbacks=[...])`; the model and its code stay as they are. Keys, per
    batch and per epoch (validation with the `val_` prefix, at epoch end):

    - `loss/replica_<k>`: replica k's mean loss over the real examples it saw this
      epoch so far (running, like Keras's own batch logs). Real examples are those with
      a nonzero sample weight, or all of them without sample weights, so padded final
      batches do not bias the values;
    - `loss/mean`: the mean over all replicas' real examples (the replicas' losses
      weighted by their real example counts); `loss/min`, `loss/max` and `loss/std`
      (population standard deviation, same weights) of the replicas' losses; on
      request `loss/sum`, the sum of the replicas' losses;
    - the same keys for every other loss a custom `train_step` reports through a
      `keras.metrics.Mean` (a GAN's `d_loss/replica_<k>`, `d_loss/mean`, ...,
      `g_loss/...`), each replica's mean of the values it added;
    - `replica_drift` (epoch logs, several replicas): the largest difference between a
      replica's copy of any weight and replica 0's (unsynchronized batch norm drifts).

    Callbacks listed after this one (and `History`) see the keys, so list it before
    `CSVLogger`, `TensorBoard` and `LossPlot`.

    Progress bar: it draws Keras's progress bar itself, showing only the keys
    `progress` asks for (it is a `keras.callbacks.ProgbarLogger`, so Keras adds no
    other; do not add one). By default, with more than 2 replicas, the bar shows the
    spread, `loss/min` and `loss/max`, beside Keras's own `loss` and metrics, and keys
    other callbacks add; every key stays in the logs. During `fit()`/`evaluate()`
    the model runs hooked copies of its step functions; afterwards its own are back,
    and the hooked ones are kept with the model, so the next `fit()` (with this callback
    or a new one) traces nothing again. Custom `train_step`s must compute their loss
    with `self.compute_loss(...)` or report it through a `keras.metrics.Mean`. In a
    standalone `evaluate()` the keys reach the other
    callbacks' logs, not its return value.

    NaN guard: after each batch every replica's loss is checked; a non-finite one is
    reported by replica, epoch and batch. At each epoch end every replica's copy of the
    weights (moving statistics included) is checked too.

    Args:
        reductions: reductions across replicas to log, any of `"mean"`, `"min"`,
            `"max"`, `"std"`, `"sum"`. Default `("mean", "min", "max", "std")`.
        per_replica: log `loss/replica_<k>`. Default True.
        batch_logs: put the values into the batch logs too (the progress bar shows them
            during an epoch). Default True.
        on_nan: `"stop"` (default): end training and restore the weights (and optimizer
            variables) from before the bad step (with `steps_per_execution=1`; with
            more it stops without restoring); `"raise"`: raise `NonFiniteError`;
            `"ignore"`: do nothing. Non-finite weights at epoch end stop or raise
            without restoring.
        sync_moving_stats: at each epoch end, after measuring the drift, replace every
            replica's copy of each non-trainable weight (batch norm moving statistics)
            by the mean of the copies, so a saved model holds global statistics (see
            `replica_drift.average_moving_statistics`). Default False.
        progress: which of its keys the progress bar shows: `"auto"` (default:
            `"spread"` with more than 2 replicas, else `"all"`), `"all"`, `"spread"`
            (`loss/min` and `loss/max`), `"none"`, or a list of keys such as
            `("loss/mean", "loss/replica_0")` (validation keys follow their names).

    Attributes:
        nan_report: the message of the non-finite value found, or None.
        drift: the `replica_drift` of each epoch.

    Raises:
        ValueError: unknown `reductions`, `on_nan` or `progress`, a flag not True or
            False, or (at `fit()`) a Keras 2 model from tf_keras.
        NonFiniteError: with `on_nan="raise"`, when a loss or weight is not finite.

    Example:
        >>> import strategykit as sk
        >>> cb = sk.callbacks.CrossReplicaLoss(reductions=("mean", "max"), progress="all")
        >>> model.fit(dataset, epochs=2, callbacks=[cb])  # doctest: +SKIP
        >>> model.history.history["loss/replica_0"]  # doctest: +SKIP
    """

    def __init__(
        self,
        reductions=DEFAULT_REDUCTIONS,
        *,
        per_replica: bool = True,
        batch_logs: bool = True,
        on_nan: str = "stop",
        sync_moving_stats: bool = False,
        progress="auto",
    ):
        super().__init__()
        chosen = _as_tuple(reductions)
        if chosen is None or not all(op in REDUCE_OPS for op in chosen):
            raise ValueError(
                f"reductions must be a list of reductions. Received: reductions="
                f"{reductions!r}. Use any of {', '.join(repr(o) for o in REDUCE_OPS)}, "
                "e.g. reductions=('mean', 'max')."
            )
        for name, value in (("per_replica", per_replica), ("batch_logs", batch_logs),
                            ("sync_moving_stats", sync_moving_stats)):
            if not isinstance(value, bool):
                raise ValueError(
                    f"{name} must be True or False. Received: {name}={value!r}. Pass "
                    f"{name}=True or {name}=False."
                )
        nan_guard.check_on_nan(on_nan)
        check_progress(progress)
        self.reductions = chosen
        self.per_replica = per_replica
        self.batch_logs = batch_logs
        self.on_nan = on_nan
        self.sync_moving_stats = sync_moving_stats
        self.progress = progress if isinstance(progress, str) else tuple(progress)
        self._display = ProgressDisplay()
        self.nan_report: str | None = None
        self.drift: list[float] = []
        self._hooks = None
        self._inspector = None
        self._in_fit = False
        self._epoch = 0
        self._validation = None

    # Keras's progress bar, drawn by this callback (see `callbacks.progress`).

    def set_model(self, model):
        check_not_keras_2(model, "model")  # fit() of a tf_keras model
        keras.callbacks.Callback.set_model(self, model)
        self._display.set_model(model)

    def set_params(self, params):
        keras.callbacks.Callback.set_params(self, params)
        self._display.set_params(params)

    def _show_progress(self) -> None:
        replicas = self.model.distribute_strategy.num_replicas_in_sync
        self._display.shown = shown_keys(self.progress, replicas)

    # Training.

    def on_train_begin(self, logs=None):
        self.nan_report, self.drift = None, []
        self._hooks = StepHooks.of(self.model)
        self._hooks.install(train=True, snapshot=self.on_nan == "stop")
        self._inspector = replica_drift.CopyInspector.of(self.model)
        self._in_fit = True
        self._show_progress()
        self._display.now("on_train_begin", logs=logs)

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch, self._validation = epoch, None
        self._hooks.train.reset()
        self._display.now("on_epoch_begin", epoch, logs=logs)

    def on_train_batch_begin(self, batch, logs=None):
        self._display.flush()

    def on_train_batch_end(self, batch, logs=None):
        read = self._read(self._hooks.train)
        for values, counts in read.values():
            self._guard_loss(values, counts, batch)
        if self.batch_logs and logs is not None:
            logs.update(self._entries(read))
        self._display.later("on_train_batch_end", batch, logs=logs)

    def on_epoch_end(self, epoch, logs=None):
        self._display.later("on_epoch_end", epoch, logs=logs)
        if logs is None:
            return
        logs.update(self._entries(self._read(self._hooks.train)))
        if self._validation is not None:
            logs.update(self._entries(self._validation, prefix="val_"))
        report = self._inspector()
        self._guard_weights(report.non_finite)
        if self.model.distribute_strategy.num_replicas_in_sync > 1:
            self.drift.append(report.drift)
            logs["replica_drift"] = report.drift
            if self.sync_moving_stats:
                replica_drift.average_moving_statistics(self.model)

    def on_train_end(self, logs=None):
        self._in_fit = False
        self._uninstall()
        self._display.now("on_train_end", logs=logs)

    # Evaluation, inside fit() or on its own.

    def on_test_begin(self, logs=None):
        if not self._in_fit:
            self._hooks = StepHooks.of(self.model)
            self._hooks.install(train=False)
            self._show_progress()
        self._hooks.test.reset()
        self._display.now("on_test_begin", logs=logs)

    def on_test_batch_begin(self, batch, logs=None):
        self._display.flush()

    def on_test_batch_end(self, batch, logs=None):
        if self.batch_logs and logs is not None:
            logs.update(self._entries(self._read(self._hooks.test)))
        self._display.later("on_test_batch_end", batch, logs=logs)

    def on_test_end(self, logs=None):
        self._validation = self._read(self._hooks.test)
        if logs is not None:
            logs.update(self._entries(self._validation))
        if not self._in_fit:
            self._uninstall()
        self._display.now("on_test_end", logs=logs)

    # Prediction: only the progress bar.

    def on_predict_begin(self, logs=None):
        self._display.now("on_predict_begin", logs=logs)

    def on_predict_batch_end(self, batch, logs=None):
        self._display.now("on_predict_batch_end", batch, logs=logs)

    def on_predict_end(self, logs=None):
        self._display.now("on_predict_end", logs=logs)

    # The values.

    def log_values(self, values, counts, prefix: str = "", name: str = "loss") -> dict:
        """The log entries of per-replica mean losses and their real example counts."""
        entries = {}
        if self.per_replica:
            entries.update({f"{prefix}{name}/replica_{k}": float(v)
                            for k, v in enumerate(values)})
        seen = counts > 0
        if seen.any():
            for op in self.reductions:
                value = reduce_stacked(values[seen], op, weights=counts[seen])
                entries[f"{prefix}{name}/{op}"] = float(value)
        return entries

    @staticmethod
    def _read(accumulator) -> dict:
        """`{loss name: (values, counts)}` of every loss the step reports."""
        return {name: accumulator.read(name) for name in accumulator.reported_names()}

    def _entries(self, read: dict, prefix: str = "") -> dict:
        entries = {}
        for name, (values, counts) in read.items():
            entries.update(self.log_values(values, counts, prefix=prefix, name=name))
        return entries

    def _guard_loss(self, values, counts, batch):
        if self.on_nan == "ignore" or np.isfinite(values[counts > 0]).all():
            return
        strategy = self.model.distribute_strategy
        message = nan_guard.loss_message(
            np.where(counts > 0, values, 0.0), epoch=self._epoch, batch=batch,
            replicas_per_worker=(len(strategy.extended.worker_devices)
                                 if is_multi_worker(strategy) else None),
        )
        if message is None:
            return
        if self.on_nan == "raise":
            self._fail(message)
        steps = self.model.steps_per_execution
        if steps > 1:  # the snapshot is from before the last of those steps only
            self._stop(message + f" Training stopped without restoring the weights: with "
                       f"steps_per_execution={steps} the guard sees only every {steps}th "
                       "step. Use steps_per_execution=1 to restore the last finite weights.")
            return
        self._hooks.snapshot.restore()
        self._stop(message + " Training stopped; the weights from before that step "
                   "are restored.")

    def _guard_weights(self, bad):
        if self.on_nan == "ignore" or not bad:
            return
        shown = ", ".join(f"{path} (replica {replica})" for path, replica in bad[:5])
        message = (
            f"Non-finite values in {len(bad)} weight copies at the end of epoch "
            f"{self._epoch}: {shown}{', ...' if len(bad) > 5 else ''}. Batch norm moving "
            "statistics can overflow while the loss stays finite; check the inputs' scale."
        )
        if self.on_nan == "raise":
            self._fail(message)
        self._stop(message + " Training stopped.")

    def _stop(self, message):
        self.nan_report = message
        self.model.stop_training = True
        warnings.warn(message, RuntimeWarning, stacklevel=2)

    def _fail(self, message):
        self.nan_report = message
        self._in_fit = False
        self._uninstall()
        raise nan_guard.NonFiniteError(message)

    def _uninstall(self):
        if self._hooks is not None:
            self._hooks.uninstall()
        self._hooks = None


def _as_tuple(reductions) -> tuple | None:
    """`reductions` as a tuple, or None for a string or what is not a collection."""
    if isinstance(reductions, str) or not hasattr(reductions, "__iter__"):
        return None
    return tuple(reductions)
