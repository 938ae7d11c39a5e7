"""`strategykit check`: `sk.check` on the demo's model, the self-test on this machine.

Trains the demo's conv net, with synchronized batch norm, for a few steps on real digits
on N replicas and on one device, and compares the weights with `sk.check` and its
defaults: in float64, within 1e-5.
"""

from __future__ import annotations

import keras

from strategykit.batchnorm.convert import convert_sync_batchnorm
from strategykit.cli.demo import build_classifier
from strategykit.data.datasets import load_digits
from strategykit.equivalence.check import CheckReport, check
from strategykit.strategy.build import mirrored


def run(replicas: int = 2, steps: int = 3) -> CheckReport:
    """Runs the self-test; the report is printable and true when it passed.

    Args:
        replicas: replicas compared against one device. Default 2.
        steps: training steps compared. Default 3.

    Returns:
        The `sk.check` report: in float64 with its default tolerance, 1e-5.

    Example:
        >>> from strategykit.cli import demo_check
        >>> print(demo_check.run(replicas=2))  # doctest: +SKIP
        PASSED: 2 replicas x 16 examples against 1 device x 32, 3 steps, in float64
        ...
    """
    strategy = mirrored(replicas=replicas)
    data = load_digits()

    def model_fn():
        keras.utils.set_random_seed(0)
        model = convert_sync_batchnorm(build_classifier(data.image_shape, data.num_classes))
        model.compile(
            optimizer=keras.optimizers.SGD(0.05),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
        return model

    return check(model_fn, (data.x_train, data.y_train), strategy=strategy,
                 global_batch_size=16 * replicas, steps=steps)
