"""`CheckReport`: what `sk.check` found, printable, true when the runs agree."""

from __future__ import annotations

import dataclasses

from strategykit.equivalence import metric_differences as metrics
from strategykit.equivalence import update_factor
from strategykit.equivalence import weight_differences as differ
from strategykit.equivalence.precision import other_dtypes_text

_ROUNDING = {"bfloat16": 2.0 ** -8, "float16": 2.0 ** -11}
"""The relative rounding (half an ulp at 1) of the 16-bit dtypes a check may compute in."""

_STAGES = {
    differ.FORWARD: "its forward state (e.g. moving statistics) differs after the first "
                    "update, so it computes differently on a replica's slice",
    differ.GRADIENTS: "the forward pass agrees after the first update, the gradients do "
                      "not (the first trainable layer)",
    differ.LATER: "the first to differ at the end; nothing differed after the first update",
}


@dataclasses.dataclass(frozen=True)
class CheckReport:
    """What `check()` found.

    Attributes:
        replicas: replicas of the distributed run.
        global_batch_size: examples per step of the distributed run, over all replicas.
        steps: weight updates made by each run in each epoch.
        epochs: the epochs both runs trained (`sk.check` trains 2: an epoch's end and
            the next pass over the data are compared too).
        partial_batch: the real examples of each epoch's final training batch, 0 where
            every batch was whole (see `coverage`).
        compute_dtype: the dtype both runs computed in (the policy's, with `dtype=None`).
        optimizer_steps: `(one device's, N replicas')` steps their optimizers counted
            (`optimizer.iterations`, which Adam's bias correction and learning-rate
            schedules read); the check fails where they differ, whatever the weights.
        fed_dataset: whether the N replicas read `sk.shard` of the user's
            `tf.data.Dataset` itself (its size unknown to tf.data where it is so).
        tolerance: largest absolute weight difference accepted.
        differences: largest absolute difference per weight, by weight path.
        single_device_loss: the loss `fit()` reported on 1 device after the steps
            (None when the step reports none under that name).
        distributed_loss: the loss `fit()` reported on N replicas after the steps.
        dtype: the dtype policy both models were built under (`"float64"`, `"float32"`),
            or None when the user's own policy was kept.
        gradient_accumulation_steps: micro-steps per update, of both runs.
        layer_differences: largest absolute weight difference per layer with weights,
            at the end, in forward order (nested models flattened, their layers named
            `"outer/inner"`).
        first_differing_layer: where the difference starts, None when it passed: the
            first layer in forward order whose weights differ beyond `tolerance` after
            the first update, forward state (non-trainable weights such as moving
            statistics) first, since backpropagation makes every trainable weight
            before a faulty layer differ too (see `first_difference_stage`).
        first_difference_stage: `"forward"` (the layer's forward state differs after
            one update: it computes differently on a replica's slice), `"gradients"`
            (the forward state agrees, trainable weights do not: look at loss scaling
            and gradient averaging) or `"later"` (nothing differed after one update;
            the first layer that differs at the end). None when it passed.
        other_dtype_layers: layers that computed in another dtype than `dtype` (they pin
            their own), by name, with their dtype policy; their rounding stays.
        single_device_metrics, distributed_metrics: what `evaluate()` returned after the
            steps (the loss and each compiled metric), on the examples of the steps and
            half a global batch more; empty when the weights differ (the metrics then
            differ for that reason: they are not compared).
        single_device_logs, distributed_logs: every value `fit()` reported after the
            steps (its History: the loss and each metric, or what a custom `train_step`
            returns), by name; compared when the weights agree.
        random_layers: the layers whose randomness was switched off on both sides (run
            as in inference: Dropout and noise pass their inputs through), by name
            (nested ones `"outer/inner"`), with their class name.
        update_factor: `c` where the N-replica first update was `c` times one device's
            (a loss not scaled for the replicas: `c` = N), None where it was not a
            multiple (see `strategykit.equivalence.update_factor`).
        differing_terms: where it failed, the layers whose `add_loss` term (from the
            same weights, on the first global batch) Keras counts otherwise on N
            replicas than on one device, as `strategykit.equivalence.added_terms`
            `DifferingTerm`s; empty where it passed.
    """

    replicas: int
    global_batch_size: int
    steps: int
    tolerance: float
    differences: dict
    single_device_loss: float | None
    distributed_loss: float | None
    dtype: str | None = None
    gradient_accumulation_steps: int = 1
    layer_differences: dict = dataclasses.field(default_factory=dict)
    first_differing_layer: str | None = None
    first_difference_stage: str | None = None
    other_dtype_layers: dict = dataclasses.field(default_factory=dict)
    single_device_metrics: dict = dataclasses.field(default_factory=dict)
    distributed_metrics: dict = dataclasses.field(default_factory=dict)
    single_device_logs: dict = dataclasses.field(default_factory=dict)
    distributed_logs: dict = dataclasses.field(default_factory=dict)
    random_layers: dict = dataclasses.field(default_factory=dict)
    update_factor: float | None = None
    differing_terms: tuple = ()
    epochs: int = 1
    partial_batch: int = 0
    fed_dataset: bool = False
    optimizer_steps: tuple = ()
    compute_dtype: str | None = None

    @property
    def coverage(self) -> str:
        """What the runs went through besides whole batches: each epoch's final batch,
        the epoch boundary, how the N replicas read the data."""
        final = (f"the last step of each epoch a partial batch ({self.partial_batch} of "
                 f"{self.global_batch_size} examples, padded on {self.replicas} replicas)"
                 if self.partial_batch else
                 "whole batches only (inputs alone carry no weights to mark a padded "
                 "batch's copies: shard them with drop_remainder=True)"
                 if self.gradient_accumulation_steps == 1 else "whole batches only")
        fed = ("the N replicas read sk.shard of your dataset as it is" if self.fed_dataset
               else "the N replicas read sk.shard of the arrays")
        return f"{final}; {fed}"

    @property
    def max_difference(self) -> float:
        """The largest absolute difference of any weight."""
        return max(self.differences.values(), default=0.0)

    @property
    def weights_agree(self) -> bool:
        """Whether every weight agrees within `tolerance`."""
        return differ.agree(self.differences.values(), self.tolerance)

    @property
    def worst_weight(self) -> str | None:
        """The path of the weight that differs most."""
        return max(self.differences, key=self.differences.get, default=None)

    @property
    def metric_differences(self) -> dict:
        """Absolute difference of each value both evaluations returned, by name."""
        return metrics.differences(self.single_device_metrics, self.distributed_metrics)

    @property
    def first_differing_metric(self) -> str | None:
        """The first of those values, in Keras's order, differing by more than
        `tolerance` (relative above 1); None when all agree or none were compared."""
        return metrics.first_differing(self.single_device_metrics, self.metric_differences,
                                       self.tolerance)

    @property
    def first_differing_log(self) -> str | None:
        """The first value `fit()` reported, in Keras's order, differing by more than
        `tolerance` (relative above 1); None when all agree or the weights differ (the
        values then differ for that reason: not compared)."""
        if not self.weights_agree:
            return None
        logs = metrics.differences(self.single_device_logs, self.distributed_logs)
        return metrics.first_differing(self.single_device_logs, logs, self.tolerance)

    @property
    def optimizer_steps_agree(self) -> bool:
        """Whether both optimizers counted the same steps."""
        return len(set(self.optimizer_steps)) <= 1

    @property
    def passed(self) -> bool:
        """Whether every weight, the optimizers' step counts, every value `fit()`
        reported and every metric `evaluate()` returned agree within `tolerance`."""
        return (self.weights_agree and self.optimizer_steps_agree
                and self.first_differing_log is None and self.first_differing_metric is None)

    def __bool__(self) -> bool:
        return self.passed

    @property
    def inconclusive(self) -> bool:
        """Whether it failed on weights computed in a 16-bit dtype, with no cause found (no
        update factor, added term or step count): their rounding alone (bfloat16 keeps 8
        significant bits) is larger than the tolerance, so the difference may be rounding.
        Check in float64 (the default `dtype`) for a verdict."""
        return (not self.passed and self.compute_dtype in _ROUNDING
                and self.update_factor is None and not self.differing_terms
                and self.optimizer_steps_agree)

    def __str__(self) -> str:
        verdict = ("PASSED" if self.passed else
                   f"INCONCLUSIVE ({self.compute_dtype} rounding)" if self.inconclusive
                   else "FAILED")
        k = self.gradient_accumulation_steps
        accumulated = f" x {k} accumulation steps" if k > 1 else ""
        lines = [
            f"{verdict}: {self.replicas} replicas x {self.global_batch_size // self.replicas} "
            f"examples{accumulated} against 1 device x {self.global_batch_size}"
            f"{' examples' + accumulated if k > 1 else ''}, {self.steps} "
            f"step{'s' if self.steps != 1 else ''}"
            + (f" x {self.epochs} epochs" if self.epochs > 1 else "")
            + (f", in {self.dtype}" if self.dtype else ""),
            f"  covered: {self.coverage}",
            f"  largest weight difference {self.max_difference:.3g} "
            f"(tolerance {self.tolerance:g}) in {self.worst_weight}",
        ]
        if not self.optimizer_steps_agree:
            lines.append(self._optimizer_steps_line())
        if self.first_differing_layer is not None:
            lines.append(f"  differences start at layer {self.first_differing_layer}: "
                         f"{_STAGES[self.first_difference_stage]}")
        lines.append(f"  last loss: 1 device {_number(self.single_device_loss)}, "
                     f"{self.replicas} replicas {_number(self.distributed_loss)}")
        if self.first_differing_log is not None:
            lines.append(self._log_line())
        lines.append(self._metrics_line())
        if self.random_layers:
            lines.append(randomness_text(self.random_layers))
        if self.other_dtype_layers:
            lines.append(f"  note: {other_dtypes_text(self.other_dtype_layers, self.dtype)}")
        lines += [term.text(self.replicas, self.global_batch_size)
                  for term in self.differing_terms]
        if not self.weights_agree and self.update_factor is not None:
            lines.append(update_factor.text(self.update_factor, self.replicas))
        elif self.inconclusive:
            lines.append(
                f"  computed in {self.compute_dtype}, which rounds to a relative "
                f"{_ROUNDING[self.compute_dtype]:.1e}: a correct run differs from one device "
                "by that rounding, beyond the tolerance, so this difference may be rounding "
                "alone. Run sk.check with dtype=\"float64\" (the default: your policy is "
                "restored afterwards) for a verdict.")
        elif not self.weights_agree and not self.differing_terms and self.optimizer_steps_agree:
            lines.append(
                "  Look for loss scaled by the per-replica batch, unsynchronized "
                "BatchNormalization (sk.convert_sync_batchnorm), or randomness outside "
                "the layers sk.check switches off (random ops without a layer's "
                "keras.random.SeedGenerator)."
            )
        return "\n".join(lines)

    def _optimizer_steps_line(self) -> str:
        single, distributed = self.optimizer_steps
        return (
            f"  the optimizers counted other steps: 1 device {single}, {self.replicas} "
            f"replicas {distributed} (optimizer.iterations, which Adam's bias correction "
            "and learning-rate schedules read): a step ran past the end of the data? "
            "Keras runs one more step at the end of every epoch of a tf.data dataset of "
            "unknown size, and its ops that do not wait for the data count it; sk.shard "
            "reads each batch before its step. Shard the data with sk.shard, or state its "
            "size with dataset.apply(tf.data.experimental.assert_cardinality(n)).")

    def _log_line(self) -> str:
        name = self.first_differing_log
        single, found = self.single_device_logs[name], self.distributed_logs[name]
        line = (f"  first value fit() reported that differs: {name}: 1 device "
                f"{single:.6g}, {self.replicas} replicas {found:.6g}")
        if metrics.scaled_for_distribution(single, found, self.replicas):
            return line + "\n" + scaled_for_distribution_text(name, self.replicas)
        return line + (" (a value the step computes on its replica's slice and returns "
                       "without combining it across replicas? Report it through a "
                       "keras.metrics object, or combine it with sk.reduce)")

    def _metrics_line(self) -> str:
        if not self.weights_agree:
            return "  metrics not compared: the weights differ"
        name = self.first_differing_metric
        if name is None:
            agreed = ", ".join(self.single_device_metrics) or "none"
            return f"  metrics evaluated after the steps agree: {agreed}"
        cause = ("the weights agree: a term add_loss or an activity regularizer adds to the "
                 "loss, computed on each replica's slice and a padded batch's copies?"
                 if name == "loss" else
                 "a custom metric whose state is not a sum? see sk.combine_across_replicas")
        return (f"  first metric that differs: {name}: 1 device "
                f"{self.single_device_metrics[name]:.6g}, {self.replicas} replicas "
                f"{self.distributed_metrics[name]:.6g} ({cause})")


def scaled_for_distribution_text(name: str, replicas: int) -> str:
    """Why a value `fit()` reports is 1/`replicas` of one device's, and the fix."""
    return (
        f"  {name} on {replicas} replicas is 1/{replicas} of one device's: the train_step "
        f"reports a loss scaled for distribution (divided by the {replicas} replicas, as "
        "tf.nn.compute_average_loss or / num_replicas_in_sync does for the gradients), and "
        "fit() averages what the replicas report. Report the unscaled loss: update the "
        "tracker with the loss times tf.distribute.get_strategy().num_replicas_in_sync "
        "(or the value before scaling), and keep the scaled one for the gradients."
    )


def randomness_text(layers: dict) -> str:
    """The line naming the layers whose randomness sk.check switched off."""
    shown = ", ".join(f"{name} ({kind})" for name, kind in layers.items())
    return (f"  randomness off in {len(layers)} layer{'s' if len(layers) != 1 else ''}: "
            f"{shown}; both runs computed them as in inference, so their random draws "
            "were not compared")


def _number(value) -> str:
    return "none" if value is None else f"{value:.6g}"
