"""`check()`: does N-replica training equal 1-device training on the global batch?

Data-parallel training is only right when N replicas, each on B/N examples, end with the
weights one device reaches on all B examples: gradients averaged over the global batch,
loss scaled by the global batch size, batch norm synchronized. `check` trains the same
model both ways from the same initial weights on the same batches and compares.
"""

from __future__ import annotations

import dataclasses

import keras
import numpy as np
import tensorflow as tf

from strategykit.strategy import mirrored


@dataclasses.dataclass(frozen=True)
class CheckReport:
    """What `check()` found.

    Attributes:
        replicas: replicas of the distributed run.
        global_batch_size: examples per step, over all replicas.
        steps: training steps taken by each run.
        tolerance: largest absolute weight difference accepted.
        differences: largest absolute difference per weight, by weight path.
        single_device_loss: the 1-device run's last reported loss.
        distributed_loss: the N-replica run's last reported loss.
    """

    replicas: int
    global_batch_size: int
    steps: int
    tolerance: float
    differences: dict
    single_device_loss: float
    distributed_loss: float

    @property
    def max_difference(self) -> float:
        """The largest absolute difference of any weight."""
        return max(self.differences.values(), default=0.0)

    @property
    def worst_weight(self) -> str | None:
        """The path of the weight that differs most."""
        return max(self.differences, key=self.differences.get, default=None)

    @property
    def passed(self) -> bool:
        """Whether every weight agrees within `tolerance`."""
        return self.max_difference <= self.tolerance

    def __bool__(self) -> bool:
        return self.passed

    def __str__(self) -> str:
        verdict = "PASSED" if self.passed else "FAILED"
        lines = [
            f"{verdict}: {self.replicas} replicas x {self.global_batch_size // self.replicas} "
            f"examples against 1 device x {self.global_batch_size}, {self.steps} steps",
            f"  largest weight difference {self.max_difference:.3g} "
            f"(tolerance {self.tolerance:g}) in {self.worst_weight}",
            f"  last loss: 1 device {self.single_device_loss:.6g}, "
            f"{self.replicas} replicas {self.distributed_loss:.6g}",
        ]
        if not self.passed:
            lines.append(
                "  Look for loss scaled by the per-replica batch, unsynchronized "
                "BatchNormalization (sk.convert_sync_batchnorm), or randomness in the model."
            )
        return "\n".join(lines)


def check(
    model_fn,
    data,
    replicas: int = 2,
    *,
    global_batch_size: int | None = None,
    steps: int = 3,
    tolerance: float = 1e-5,
    strategy: tf.distribute.Strategy | None = None,
) -> CheckReport:
    """Trains `model_fn()` on 1 device and on N replicas and compares the weights.

    Both runs start from the same weights (the 1-device model's initial weights are
    copied into the distributed one) and see the same global batches in the same order,
    unshuffled. The model must be deterministic (no dropout or random augmentation).

    Args:
        model_fn: a function without arguments returning a compiled Keras model. It is
            called twice: once outside any strategy, once inside the N-replica scope.
        data: `(x, y)` numpy arrays (or dicts of arrays for named inputs).
        replicas: replicas of the distributed run. Default 2.
        global_batch_size: examples per step over all replicas. Default: `4 * replicas`.
            Must be a multiple of `replicas`.
        steps: training steps to compare. Default 3.
        tolerance: largest absolute weight difference accepted. Default 1e-5.
        strategy: the N-replica strategy to use. Default: `sk.mirrored(replicas=replicas)`.

    Returns:
        A `CheckReport`; true when the weights agree, and printable.

    Raises:
        ValueError: `global_batch_size` is not a multiple of `replicas`, the data holds
            fewer than `steps` global batches, or `model_fn` returns an uncompiled model.

    Example:
        >>> import keras, numpy as np, strategykit as sk
        >>> def model_fn():
        ...     model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        ...     model.compile("sgd", "mse")
        ...     return model
        >>> x = np.random.default_rng(0).normal(size=(32, 3)).astype("float32")
        >>> report = sk.check(model_fn, (x, x.sum(1)), replicas=2)  # doctest: +SKIP
        >>> report.passed  # doctest: +SKIP
        True
    """
    strategy = strategy or mirrored(replicas=replicas)
    replicas = strategy.num_replicas_in_sync
    global_batch_size = global_batch_size or 4 * replicas
    _check_arguments(data, replicas, global_batch_size, steps)
    batches = tf.data.Dataset.from_tensor_slices(data).batch(global_batch_size).take(steps)

    single = _compiled(model_fn)
    initial_weights = single.get_weights()
    single_loss = _train(single, batches)
    with strategy.scope():
        distributed = _compiled(model_fn)
    distributed.set_weights(initial_weights)
    distributed_loss = _train(distributed, batches)

    differences = {
        a.path: float(np.max(np.abs(np.asarray(a) - np.asarray(b)), initial=0.0))
        for a, b in zip(single.weights, distributed.weights)
    }
    return CheckReport(
        replicas=replicas,
        global_batch_size=global_batch_size,
        steps=steps,
        tolerance=tolerance,
        differences=differences,
        single_device_loss=single_loss,
        distributed_loss=distributed_loss,
    )


def _train(model: keras.Model, batches: tf.data.Dataset) -> float:
    """One pass over `batches`, in order; returns the last reported loss."""
    return model.fit(batches, epochs=1, verbose=0, shuffle=False).history["loss"][-1]


def _compiled(model_fn) -> keras.Model:
    model = model_fn()
    if not isinstance(model, keras.Model) or not model.compiled:
        raise ValueError(
            f"model_fn must return a compiled Keras model. Received: {type(model).__name__}"
            f"{'' if not isinstance(model, keras.Model) else ' (not compiled)'}. Call "
            "model.compile(optimizer, loss) inside model_fn before returning the model."
        )
    return model


def _check_arguments(data, replicas, global_batch_size, steps) -> None:
    if global_batch_size % replicas:
        raise ValueError(
            f"global_batch_size={global_batch_size} does not divide evenly over {replicas} "
            f"replicas. Received: global_batch_size={global_batch_size}. Use a multiple "
            f"of {replicas}."
        )
    examples = len(tf.nest.flatten(data)[0])
    if examples < steps * global_batch_size:
        raise ValueError(
            f"The data holds {examples} examples, fewer than steps x global_batch_size = "
            f"{steps} x {global_batch_size}. Received: steps={steps}, global_batch_size="
            f"{global_batch_size}. Pass more data, fewer steps or a smaller batch."
        )
