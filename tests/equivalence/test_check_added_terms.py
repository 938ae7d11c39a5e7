"""`sk.check` on terms layers add to the loss: activity regularizers pass, a sum over the
batch added with `add_loss` is named in one line.

keras.io's built-in-methods guide adds `1e-2 * ops.sum(inputs)` in a layer
(`ActivityRegularizationLayer`): Keras scales each replica's term by 1/N, so the sum
counts 1/N of one device's, and strategykit cannot tell it from a mean. The same term as
a mean trains as one device; an activity regularizer too, also over the padded copies
of the final batch sk.check evaluates (37 examples: 2 steps of 16 and a final 5).
"""

import keras
import numpy as np
import pytest
from keras import ops

import strategykit as sk

from conftest import cpu_devices

REPLICAS = 4


class ActivityRegularizationLayer(keras.layers.Layer):
    """keras.io's: a loss of the layer's inputs, summed over the batch."""

    def call(self, inputs):
        self.add_loss(1e-2 * ops.sum(inputs))
        return inputs


class MeanActivityRegularizationLayer(keras.layers.Layer):
    """The same term, a mean over the batch's examples."""

    def call(self, inputs):
        self.add_loss(1e-2 * ops.mean(ops.sum(inputs, axis=-1)))
        return inputs


def _model_fn(middle):
    def model_fn():
        keras.utils.set_random_seed(0)
        inputs = keras.Input((5,))
        x = keras.layers.Dense(4, activation="relu")(inputs)
        x = middle()(x)
        model = keras.Model(inputs, keras.layers.Dense(1)(x))
        model.compile(keras.optimizers.SGD(0.1), "mse")
        return model

    return model_fn


def _data(examples=37):
    rng = np.random.default_rng(0)
    return rng.normal(size=(examples, 5)), rng.normal(size=(examples, 1))


def _check(middle):
    return sk.check(_model_fn(middle), _data(), strategy=sk.mirrored(cpu_devices(REPLICAS)),
                    global_batch_size=16, steps=2, tolerance=1e-10)


def test_a_sum_over_the_batch_is_named_with_its_layer():
    report = _check(lambda: ActivityRegularizationLayer(name="guide_regularization"))
    assert not report.passed
    [term] = report.differing_terms
    assert term.layer == "guide_regularization" and term.cause == "sum"
    assert term.distributed == pytest.approx(term.single / REPLICAS, rel=1e-12)
    assert ("layer guide_regularization: its add_loss term is a sum over the batch"
            in str(report))
    assert "1/4 of one device's; add a mean over the batch (ops.mean)" in str(report)
    assert "Look for loss scaled" not in str(report)  # the generic hint gives way


def test_a_mean_over_the_batch_is_named_where_the_copies_count():
    # exact on full batches (the weights agree); the evaluation's final batch of 5,
    # filled up to 16 with copies, counts them
    report = _check(lambda: MeanActivityRegularizationLayer(name="mean_regularization"))
    assert report.weights_agree and report.first_differing_metric == "loss"
    [term] = report.differing_terms
    assert (term.layer, term.cause, term.batch) == ("mean_regularization", "copies", 5)
    assert ("layer mean_regularization: its add_loss term counts the padded copies of the "
            "final batch (5 examples filled up to 16;") in str(report)


def test_an_activity_regularizer_passes_over_a_padded_final_batch():
    report = _check(lambda: keras.layers.Dense(
        4, activity_regularizer=keras.regularizers.L1(0.05), name="regularized"))
    assert report.passed, str(report)
    assert report.single_device_metrics  # evaluated, over a padded final batch of 5
