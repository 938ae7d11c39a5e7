"""Every number Keras reports under N replicas equals one device's on the same examples.

One device runs Keras as it is, on numpy arrays in batches of the global batch size (its
final batch holds the remainder); N replicas run on `sk.shard` data with its defaults,
whose final partial batch is padded. The data give each replica different examples and
labels, so summing or averaging the replicas' metrics the wrong way shows.
"""

import functools
import re
import warnings

import keras
import numpy as np
import pytest

import strategykit as sk

from conftest import cpu_devices, final_progress_lines

GLOBAL_BATCH = 32


def binary_data(size, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(size, 6)).astype("float32")
    y = (x[:, 0] + 0.7 * rng.normal(size=size) > 0.2).astype("float32")
    weights = rng.choice([0.0, 0.5, 1.0, 3.0], size=size).astype("float32")  # zeros too
    return x, y, weights


def binary_model(seed=1, steps_per_execution=1):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(4, activation="tanh"),
                              keras.layers.Dense(1, activation="sigmoid")])
    model.compile(
        keras.optimizers.SGD(0.1, momentum=0.9), "binary_crossentropy",
        metrics=["accuracy", keras.metrics.AUC(name="auc"), keras.metrics.Recall(name="recall"),
                 keras.metrics.Precision(name="precision"),
                 keras.metrics.MeanSquaredError(name="mse")],
        weighted_metrics=[keras.metrics.BinaryAccuracy(name="weighted_accuracy"),
                          keras.metrics.AUC(name="weighted_auc")],
        steps_per_execution=steps_per_execution,
    )
    return model


def on_replicas(make_model, strategy, weights):
    with strategy.scope():
        model = make_model()
    model.set_weights(weights)
    return model


def assert_logs_equal(actual, expected, rtol, case=""):
    """`case` starts each failure message: which of several compared runs failed."""
    assert set(actual) == set(expected), case
    for key in expected:
        np.testing.assert_allclose(actual[key], expected[key], rtol=rtol, atol=1e-7,
                                   err_msg=case + key)


@pytest.mark.parametrize("replicas, sizes", [
    (4, (203,  # a final batch of 11: more examples than replicas
         194,  # a final batch of 2: fewer than replicas, two replicas hold copies only
         224)),  # no partial batch
    (2, (203,)),
], ids=["4_replicas", "2_replicas"])
def test_evaluate_equals_one_device(replicas, sizes):
    # One model per replica count, its test step traced once: the sizes differ only in
    # their examples, as sk.shard pads the final batch to the shapes of the others.
    # evaluate() resets the metrics.
    strategy = sk.mirrored(cpu_devices(replicas))
    with strategy.scope():
        model = binary_model()
    for size in sizes:
        x, y, w = binary_data(size)
        expected, weights = one_device_evaluation(size)
        model.set_weights(weights)
        data = sk.shard((x, y, w), strategy, global_batch_size=GLOBAL_BATCH)
        assert_logs_equal(model.evaluate(data, verbose=0, return_dict=True), expected, 1e-5,
                          f"{size} examples on {replicas} replicas: ")


@functools.cache
def one_device_evaluation(size):
    """One device's `evaluate()` logs of `binary_data(size)`, and its model's weights.

    Computed once per size in a test process: the tests of 203 and 224 examples compare
    their replicas with the same one-device run.
    """
    x, y, w = binary_data(size)
    one_device = binary_model()
    logs = one_device.evaluate(x, y, sample_weight=w, batch_size=GLOBAL_BATCH, verbose=0,
                               return_dict=True)
    return logs, one_device.get_weights()


def evaluated_on_one_device(size, replicas, make_strategy, steps_per_execution=1):
    """One device's `evaluate()` of `size` examples, and the same model on `replicas`
    replicas with the same examples as `sk.shard` data."""
    x, y, w = binary_data(size)
    expected, weights = one_device_evaluation(size)
    strategy = make_strategy(replicas)
    model = on_replicas(lambda: binary_model(steps_per_execution=steps_per_execution), strategy,
                        weights)
    return dict(expected), model, sk.shard((x, y, w), strategy, global_batch_size=GLOBAL_BATCH)


def assert_evaluate_equals_one_device(size, replicas, make_strategy, steps_per_execution=1):
    expected, model, data = evaluated_on_one_device(size, replicas, make_strategy,
                                                    steps_per_execution)
    assert_logs_equal(model.evaluate(data, verbose=0, return_dict=True), expected, 1e-5)


def test_several_steps_per_call_on_several_replicas_are_exact(make_strategy):
    # strategykit runs the steps of each call itself (upstream.steps_per_execution), so
    # the all-reduce of the padded final batch works: no warning, one device's numbers.
    # 2 replicas, not 4: no replica holds copies only on 4 either; 4 would only trace more.
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        assert_evaluate_equals_one_device(203, 2, make_strategy, steps_per_execution=3)


def test_keras_own_loop_of_several_steps_warns_and_runs_as_keras(make_strategy):
    # With `steps`, Keras runs its own loop, where TensorFlow cannot all-reduce: the
    # numbers are Keras's own (exact without a padded batch), and the user is told. 2
    # replicas, not 4: any number of replicas takes that loop; 4 would only trace more.
    expected, model, data = evaluated_on_one_device(224, 2, make_strategy,
                                                    steps_per_execution=3)
    with pytest.warns(UserWarning, match=r"steps_per_execution=3 under 2 replicas, with "
                      r"steps_per_epoch .* Leave out steps_per_epoch"):
        got = model.evaluate(data, steps=224 // GLOBAL_BATCH, verbose=0, return_dict=True)
    assert_logs_equal(got, expected, 1e-5)


def test_keras_counts_the_padded_copies_without_the_fix(make_strategy):
    # What strategykit/upstream/exact_metrics.py fixes (tensorflow/tensorflow#39268): when
    # this fails, Keras counts only real examples itself; then delete the fix. 2 replicas,
    # not 4: the final batch of 11 is padded with copies to 32 there too.
    from strategykit.upstream import exact_metrics

    expected, model, data = evaluated_on_one_device(203, 2, make_strategy)  # sk.shard installs
    for fix in exact_metrics.FIXES:
        fix.uninstall()
    try:
        got = model.evaluate(data, verbose=0, return_dict=True)
    finally:
        for fix in exact_metrics.FIXES:
            fix.install()
    for key in ("accuracy", "recall", "loss", "weighted_accuracy"):
        assert abs(got[key] - expected[key]) > 1e-4, key


def test_fit_history_with_validation_equals_one_device(make_strategy):
    x, y, w = binary_data(203)
    # A final validation batch of 1 < 2 replicas: one replica holds padded copies only.
    # 2 replicas, not 4: each replica's step is traced, and 4 add no other path here
    # (test_evaluate_equals_one_device pads 4 replicas).
    x_val, y_val, w_val = binary_data(97, seed=5)
    one_device = binary_model()
    start = one_device.get_weights()
    expected = one_device.fit(x, y, sample_weight=w, batch_size=GLOBAL_BATCH, epochs=2,
                              shuffle=False, verbose=0,
                              validation_data=(x_val, y_val, w_val)).history
    strategy = make_strategy(2)
    model = on_replicas(binary_model, strategy, start)
    shard = lambda *data: sk.shard(data, strategy, global_batch_size=GLOBAL_BATCH)  # noqa: E731
    history = model.fit(shard(x, y, w), epochs=2, verbose=0,
                        validation_data=shard(x_val, y_val, w_val)).history
    assert set(history) == set(expected)
    for key in expected:
        np.testing.assert_allclose(history[key], expected[key], rtol=1e-4, err_msg=key)


def classes_data(size, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(size, 6)).astype("float32")
    y = np.argmax(x[:, :5] + rng.normal(size=(size, 5)), axis=1).astype("int32")
    return x, y


def classes_model(seed=2, loss="sparse_categorical_crossentropy", accuracy="accuracy"):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(5, activation="softmax")])
    model.compile("sgd", loss, metrics=[
        accuracy, keras.metrics.SparseTopKCategoricalAccuracy(2, name="top2")
        if loss.startswith("sparse") else keras.metrics.TopKCategoricalAccuracy(2, name="top2")])
    return model


@pytest.mark.parametrize("one_hot", [False, True])
def test_evaluate_of_classes_equals_one_device(one_hot, make_strategy):
    x, y = classes_data(203)
    loss = "categorical_crossentropy" if one_hot else "sparse_categorical_crossentropy"
    if one_hot:
        y = keras.utils.to_categorical(y, 5)
    make = lambda: classes_model(loss=loss)  # noqa: E731
    one_device = make()
    expected = one_device.evaluate(x, y, batch_size=GLOBAL_BATCH, verbose=0, return_dict=True)
    strategy = make_strategy(2)  # a padded final batch of 11 too, at half 4's tracing
    model = on_replicas(make, strategy, one_device.get_weights())
    data = sk.shard((x, y), strategy, global_batch_size=GLOBAL_BATCH)
    assert_logs_equal(model.evaluate(data, verbose=0, return_dict=True), expected, 1e-5)


def segmentation_model(seed=3):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((4, 4, 2)),
                              keras.layers.Conv2D(3, 3, padding="same", activation="softmax")])
    model.compile("sgd", "sparse_categorical_crossentropy", metrics=[
        keras.metrics.MeanIoU(3, sparse_y_pred=False, name="iou"), "accuracy"])
    return model


def test_evaluate_of_per_pixel_labels_equals_one_device(make_strategy):
    rng = np.random.default_rng(4)
    x = rng.normal(size=(45, 4, 4, 2)).astype("float32")
    y = rng.integers(0, 3, size=(45, 4, 4)).astype("int32")
    one_device = segmentation_model()
    expected = one_device.evaluate(x, y, batch_size=8, verbose=0, return_dict=True)
    strategy = make_strategy(2)  # padded as on 4, at half 4's tracing
    model = on_replicas(segmentation_model, strategy, one_device.get_weights())
    data = sk.shard((x, y), strategy, global_batch_size=8)  # a final batch of 5, padded
    assert_logs_equal(model.evaluate(data, verbose=0, return_dict=True), expected, 1e-5)


@pytest.mark.skipif(
    tuple(int(part) for part in keras.__version__.split(".")[:2]) < (3, 11),
    reason=f"Keras {keras.__version__}'s progress bar ends an epoch with every value "
           "averaged over its steps, on one device too (from 3.11 with the epoch's "
           "values): not History's")
def test_the_progress_bar_ends_each_epoch_with_the_values_of_history(make_strategy, capsys,
                                                                    monkeypatch):
    # Every step drawn, as on a slow machine: the bar's step-7 line (running averages)
    # precedes the epoch's finished line, which is the one compared.
    draw = keras.utils.Progbar.__init__
    monkeypatch.setattr(keras.utils.Progbar, "__init__",
                        lambda self, *args, **kwargs: draw(self, *args, **kwargs, interval=0))
    x, y, w = binary_data(203)
    strategy = make_strategy(2)  # padded as on 4, at half 4's tracing
    model = on_replicas(binary_model, strategy, binary_model().get_weights())
    history = model.fit(sk.shard((x, y, w), strategy, global_batch_size=GLOBAL_BATCH),
                        epochs=2, verbose=1).history
    finals = final_progress_lines(capsys.readouterr().out)  # each epoch's finished bar
    assert [line.split(" ")[0] for line in finals] == ["7/7", "7/7"]
    for epoch, line in enumerate(finals):
        shown = dict(re.findall(r"(\w+): ([-\d.e+]+)", line))
        assert set(shown) == set(history)
        for key, value in shown.items():
            assert float(value) == pytest.approx(history[key][epoch], abs=6e-5), key


class RunningMax(keras.metrics.Metric):
    """The largest prediction seen: a state that is not a sum over examples."""

    def __init__(self, name="running_max", **kwargs):
        super().__init__(name=name, **kwargs)
        self.maximum = self.add_variable((), "zeros", name="maximum")

    def update_state(self, y_true, y_pred, sample_weight=None):
        self.maximum.assign(keras.ops.maximum(self.maximum, keras.ops.max(y_pred)))

    def result(self):
        return self.maximum


def regression_model(metric, seed=7):
    # Seed 7: a kernel of positive sum, so predictions rise with x above 0. (Seed 6 made
    # them all negative: every maximum stayed at its initial 0 and could not differ.)
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse", metrics=[metric])
    return model


def regression_data():
    # Rising predictions: the running maximum of one device is that of the last batch;
    # summed over N replicas it would be about N times as large.
    x = np.repeat(np.linspace(0.1, 2.0, 64, dtype="float32")[:, None], 6, axis=1)
    return x, np.zeros(64, "float32")


def test_a_declared_running_maximum_equals_one_devices(make_strategy):
    class DeclaredMax(RunningMax):
        pass

    assert sk.combine_across_replicas(DeclaredMax, maximum="max") is DeclaredMax
    x, y = regression_data()
    one_device = regression_model(DeclaredMax())
    expected = one_device.evaluate(x, y, batch_size=16, verbose=0, return_dict=True)
    assert expected["running_max"] > 0.5  # above the initial 0: a real maximum to combine
    fit_expected = regression_model(DeclaredMax()).fit(
        x, y, batch_size=16, epochs=2, shuffle=False, verbose=0).history
    strategy = make_strategy(2)  # summed: twice the maximum; 4 would only trace more
    shard = sk.shard((x, y), strategy, global_batch_size=16)
    model = on_replicas(lambda: regression_model(DeclaredMax()), strategy,
                        one_device.get_weights())
    assert_logs_equal(model.evaluate(shard, verbose=0, return_dict=True), expected, 1e-6)
    with strategy.scope():
        model = regression_model(DeclaredMax())
    history = model.fit(shard, epochs=2, verbose=0).history
    np.testing.assert_allclose(history["running_max"], fit_expected["running_max"], rtol=1e-5)


def test_an_undeclared_custom_metric_warns_naming_it_its_variable_and_the_fix(make_strategy):
    x, y = regression_data()
    strategy = make_strategy(2)  # the warning is made alike on 4, which only trace more
    with strategy.scope():
        model = regression_model(RunningMax())
    with pytest.warns(UserWarning) as caught:
        model.evaluate(sk.shard((x, y), strategy, global_batch_size=16), verbose=0)
    message = next(str(w.message) for w in caught if "running_max" in str(w.message))
    assert "metric 'running_max' (RunningMax)" in message
    assert "'maximum' (aggregation 'sum')" in message
    assert "Under 2 replicas" in message
    assert 'sk.combine_across_replicas(RunningMax, maximum="max")' in message


def test_combine_across_replicas_rejects_what_it_cannot_use():
    with pytest.raises(ValueError, match=r"needs a keras.metrics.Metric.*Received: metric=3"):
        sk.combine_across_replicas(3, maximum="max")
    with pytest.raises(ValueError, match="at least one variable"):
        sk.combine_across_replicas(RunningMax)
    with pytest.raises(ValueError, match=r"Unknown combine for variable 'maximum'.*'median'"):
        sk.combine_across_replicas(RunningMax, maximum="median")
    with pytest.raises(ValueError, match=r"has no variable 'largest'.*Its variables: 'maximum'"):
        sk.combine_across_replicas(RunningMax(), largest="max")
