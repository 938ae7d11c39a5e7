"""`CheckReport`: what `sk.check` found, printable, true when the runs agree."""

from __future__ import annotations

import dataclasses

from strategykit.equivalence import metric_differences as metrics
from strategykit.equivalence import weight_differences as differ
from strategykit.equivalence.precision import other_dtypes_text

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
        steps: weight updates made by each run.
        tolerance: largest absolute weight difference accepted.
        differences: largest absolute difference per weight, by weight path.
        single_device_loss: the 1-device run's last reported loss.
        distributed_loss: the N-replica run's last reported loss.
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
    """

    replicas: int
    global_batch_size: int
    steps: int
    tolerance: float
    differences: dict
    single_device_loss: float
    distributed_loss: float
    dtype: str | None = None
    gradient_accumulation_steps: int = 1
    layer_differences: dict = dataclasses.field(default_factory=dict)
    first_differing_layer: str | None = None
    first_difference_stage: str | None = None
    other_dtype_layers: dict = dataclasses.field(default_factory=dict)
    single_device_metrics: dict = dataclasses.field(default_factory=dict)
    distributed_metrics: dict = dataclasses.field(default_factory=dict)

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
    def passed(self) -> bool:
        """Whether every weight and every metric agree within `tolerance`."""
        return self.weights_agree and self.first_differing_metric is None

    def __bool__(self) -> bool:
        return self.passed

    def __str__(self) -> str:
        verdict = "PASSED" if self.passed else "FAILED"
        k = self.gradient_accumulation_steps
        accumulated = f" x {k} accumulation steps" if k > 1 else ""
        lines = [
            f"{verdict}: {self.replicas} replicas x {self.global_batch_size // self.replicas} "
            f"examples{accumulated} against 1 device x {self.global_batch_size}"
            f"{' examples' + accumulated if k > 1 else ''}, {self.steps} "
            f"step{'s' if self.steps != 1 else ''}"
            + (f", in {self.dtype}" if self.dtype else ""),
            f"  largest weight difference {self.max_difference:.3g} "
            f"(tolerance {self.tolerance:g}) in {self.worst_weight}",
        ]
        if self.first_differing_layer is not None:
            lines.append(f"  differences start at layer {self.first_differing_layer}: "
                         f"{_STAGES[self.first_difference_stage]}")
        lines.append(f"  last loss: 1 device {self.single_device_loss:.6g}, "
                     f"{self.replicas} replicas {self.distributed_loss:.6g}")
        lines.append(self._metrics_line())
        if self.other_dtype_layers:
            lines.append(f"  note: {other_dtypes_text(self.other_dtype_layers, self.dtype)}")
        if not self.weights_agree:
            lines.append(
                "  Look for loss scaled by the per-replica batch, unsynchronized "
                "BatchNormalization (sk.convert_sync_batchnorm), or randomness in the model."
            )
        return "\n".join(lines)

    def _metrics_line(self) -> str:
        if not self.weights_agree:
            return "  metrics not compared: the weights differ"
        name = self.first_differing_metric
        if name is None:
            agreed = ", ".join(self.single_device_metrics) or "none"
            return f"  metrics evaluated after the steps agree: {agreed}"
        return (f"  first metric that differs: {name}: 1 device "
                f"{self.single_device_metrics[name]:.6g}, {self.replicas} replicas "
                f"{self.distributed_metrics[name]:.6g} (a custom metric whose state is not "
                "a sum? see sk.combine_across_replicas)")
