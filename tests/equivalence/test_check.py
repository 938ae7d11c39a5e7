import os
import re
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

import strategykit as sk

from conftest import bn_regressor, cpu_devices


def dense_model():
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="tanh"),
                              keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.1), "mse")
    return model


def bn_model():
    return bn_regressor(seed=1)


def data(examples=48):
    # Every replica's slice of a global batch differs (rows grow with the index).
    x = np.linspace(-1.0, 3.0, examples * 3, dtype="float32").reshape(examples, 3)
    return x, x.sum(axis=1) ** 2


def test_a_dense_model_trains_identically_on_replicas_and_one_device():
    # On 4 replicas; on 2: test_replicas_default_to_a_strategy_built_by_mirrored.
    report = sk.check(dense_model, data(), strategy=sk.mirrored(cpu_devices(4)),
                      global_batch_size=8, steps=4)
    assert_dense_model_passed(report, 4)


def assert_dense_model_passed(report, replicas):
    assert report.passed, str(report)
    assert report.replicas == replicas
    assert report.single_device_loss == pytest.approx(report.distributed_loss, rel=1e-5)
    assert "PASSED: " in str(report)


def metrics_model(*extra):
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="tanh"),
                              keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.1), "mse", metrics=[
        keras.metrics.MeanAbsoluteError(name="mae"), *extra])
    return model


def test_the_compiled_metrics_are_evaluated_and_compared_after_the_steps():
    # 45 examples: evaluation ends with a padded batch of 5 on 4 replicas.
    report = sk.check(metrics_model, data(45), strategy=sk.mirrored(cpu_devices(4)),
                      global_batch_size=8, steps=4)
    assert report.passed, str(report)
    assert set(report.single_device_metrics) == {"loss", "mae"}
    assert report.distributed_metrics["mae"] == pytest.approx(
        report.single_device_metrics["mae"], rel=1e-9)
    assert report.first_differing_metric is None
    assert "metrics evaluated after the steps agree: loss, mae" in str(report)


def test_a_metric_that_differs_fails_the_check_and_is_named():
    from test_exact_metrics import RunningMax  # its state is not a sum, and not declared

    with pytest.warns(UserWarning, match="running_max"):
        report = sk.check(lambda: metrics_model(RunningMax()), data(),
                          strategy=sk.mirrored(cpu_devices(2)), global_batch_size=8, steps=2)
    assert report.max_difference <= report.tolerance  # the weights agree
    assert not report.passed
    assert report.first_differing_metric == "running_max"
    assert "FAILED" in str(report)
    assert "first metric that differs: running_max: 1 device" in str(report)
    assert "sk.combine_across_replicas" in str(report)


def test_unsynchronized_batch_norm_is_caught():
    report = sk.check(bn_model, data(), strategy=sk.mirrored(cpu_devices(2)),
                      global_batch_size=8, steps=4)
    assert not report.passed
    assert report.max_difference > 1e-3
    assert "FAILED" in str(report) and "sk.convert_sync_batchnorm" in str(report)


def test_replicas_default_to_a_strategy_built_by_mirrored():
    # Also the dense model's check on 2 replicas (on 4: the test above): one check, one
    # tracing of each model, for both.
    report = sk.check(dense_model, data(), replicas=2)
    assert report.global_batch_size == 8 and report.steps == 3
    assert_dense_model_passed(report, 2)


def test_the_batch_must_divide_over_the_replicas():
    with pytest.raises(ValueError, match=r"global_batch_size=6 does not divide evenly over 4 "
                       r"replicas\. Received: global_batch_size=6\. Use a multiple of 4"):
        sk.check(dense_model, data(), strategy=sk.mirrored(cpu_devices(4)), global_batch_size=6)


def test_too_little_data_for_the_steps_is_an_error():
    with pytest.raises(ValueError, match=r"holds 10 examples, fewer than steps x "
                       r"global_batch_size = 3 x 8"):
        sk.check(dense_model, data(10), replicas=2)


@pytest.mark.parametrize("given, received", [
    (lambda x, y: (x, y, y, y), "a tuple of 4"), (lambda x, y: "x.npy", "str")],
    ids=["4-tuple", "str"])
def test_data_must_be_arrays_with_or_without_labels(given, received):
    with pytest.raises(ValueError, match=r"data must be \(x, y\), \(x, y, sample_weight\), or "
                       r"the inputs alone \(an array, a dict of arrays, or \(x,\)\)\. "
                       rf"Received: {received}\. Pass numpy arrays"):
        sk.check(dense_model, given(*data()), replicas=2)


def test_model_fn_must_return_a_compiled_model():
    def uncompiled():
        return keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])

    with pytest.raises(ValueError, match=r"must return a compiled Keras model\. Received: "
                       r"model_fn\(\) returned a Sequential model \(not compiled\)"):
        sk.check(uncompiled, data(), replicas=2)


# The net of issue 12: a DeepLab-style segmentation net on a ResNet50 backbone up to
# conv4_block6_out (43 BN layers) with a small head (1 more), 5 classes. Issue 12 used
# 64x64 inputs on 4 replicas; 32x32 (the smallest ResNet50 takes) on 2 replicas shows the
# same in half the time: the time goes into tracing the net, once per replica. So the
# models also run eagerly (half the CPU time again, measured): the operations, and so
# the float64 arithmetic compared, are those of the traced step; sk.check of traced
# synchronized batch norm: tests/batchnorm/test_sync_bn.py.
def deeplab_fn(synchronized, built=None):
    """`model_fn` of that net; each model it builds is appended to `built` if given."""
    def model_fn():
        keras.utils.set_random_seed(0)
        backbone = keras.applications.ResNet50(weights=None, include_top=False,
                                               input_shape=(32, 32, 3))
        x = backbone.get_layer("conv4_block6_out").output
        x = keras.layers.Conv2D(32, 1, use_bias=False)(x)
        x = keras.layers.BatchNormalization()(x)
        x = keras.layers.ReLU()(x)
        x = keras.layers.Conv2D(5, 1)(x)
        logits = keras.layers.UpSampling2D(16, interpolation="bilinear")(x)
        model = keras.Model(backbone.input, logits)
        if synchronized:
            model = sk.convert_sync_batchnorm(model)
        model.compile(keras.optimizers.SGD(0.01),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      run_eagerly=True)
        if built is not None:
            built.append(model)
        return model

    return model_fn


@pytest.mark.slow
def test_the_44_batch_norm_resnet50_net_passes_with_sync_bn_and_fails_without():
    # float32 rounding alone moves this net 0.03 in 3 steps (as much as the real error);
    # the default float64 comparison separates the two.
    rng = np.random.default_rng(0)
    data = (rng.normal(size=(6, 32, 32, 3)).astype("float32"),
            rng.integers(0, 5, size=(6, 32, 32)))
    strategy = sk.mirrored(cpu_devices(2))

    # One step shows it (local BN 0.21 apart, synchronized 1e-14), a third of the CPU time.
    built = []
    synced = sk.check(deeplab_fn(synchronized=True, built=built), data, strategy=strategy,
                      global_batch_size=4, steps=1, epochs=1)
    assert len(built) == 2  # the one device's model and the replicas'
    for model in built:
        assert sum(isinstance(layer, sk.SyncBatchNormalization) for layer in model.layers) == 44
    assert synced.passed, str(synced)
    assert synced.dtype == "float64" and synced.max_difference < 1e-8
    assert synced.first_differing_layer is None

    local = sk.check(deeplab_fn(synchronized=False), data, strategy=strategy,
                     global_batch_size=4, steps=1, epochs=1)
    assert not local.passed and local.max_difference > 1e-2
    assert local.first_differing_layer == "conv1_bn"
    assert local.first_difference_stage == "forward"
    assert str(local).startswith("FAILED: 2 replicas x 2 examples against 1 device x 4, "
                                 "1 step, in float64\n")
    assert "differences start at layer conv1_bn" in str(local)
    assert "metrics not compared: the weights differ" in str(local)  # nor evaluated
    assert local.first_differing_metric is None and not local.single_device_metrics


@pytest.fixture
def global_policy():
    """Sets the global dtype policy for a test; restores float32 afterwards."""
    yield keras.config.set_dtype_policy
    keras.config.set_dtype_policy("float32")


@pytest.mark.parametrize("dtype, built", [("float64", "float64"), ("float32", "float32"),
                                          (None, "mixed_bfloat16")])
def test_models_are_built_in_dtype_and_the_users_policy_is_restored(
        global_policy, dtype, built):
    global_policy("mixed_bfloat16")
    policies = []

    def model_fn():
        model = dense_model()
        policies.append(model.layers[0].dtype_policy.name)
        return model

    report = sk.check(model_fn, data(), strategy=sk.mirrored(cpu_devices(2)), dtype=dtype)
    assert policies == [built, built]
    assert report.dtype == dtype
    assert keras.config.dtype_policy().name == "mixed_bfloat16"


def test_a_correct_model_in_mixed_bfloat16_is_inconclusive_not_blamed(global_policy):
    # bfloat16 keeps 8 significant bits: N replicas sum in another order and end a few
    # 1e-3 from one device, which no tolerance of the default's size separates from an error
    global_policy("mixed_bfloat16")
    synchronized = lambda: sk.convert_sync_batchnorm(bn_model())  # noqa: E731
    report = sk.check(synchronized, data(), strategy=sk.mirrored(cpu_devices(2)), dtype=None)
    assert not report.passed and report.inconclusive, str(report)
    assert report.compute_dtype == "bfloat16"
    text = str(report)
    assert text.startswith("INCONCLUSIVE (bfloat16 rounding): 2 replicas")
    assert "rounds to a relative 3.9e-03" in text and 'dtype="float64"' in text
    assert "unsynchronized BatchNormalization" not in text  # no cause blamed
    assert sk.check(synchronized, data(), strategy=sk.mirrored(cpu_devices(2))).passed


def test_the_users_policy_is_restored_when_the_check_raises(global_policy):
    global_policy("mixed_float16")

    def broken():
        raise RuntimeError("model_fn broke")

    with pytest.raises(RuntimeError, match="model_fn broke"):
        sk.check(broken, data(), strategy=sk.mirrored(cpu_devices(2)))
    assert keras.config.dtype_policy().name == "mixed_float16"


def pinned_fn(layer_fn):
    def model_fn():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1, name="free"),
                                  layer_fn()])
        model.compile(keras.optimizers.SGD(0.1), "mse")
        return model

    return model_fn


def test_layers_computing_in_their_own_dtype_are_reported():
    pinned = pinned_fn(lambda: keras.layers.Activation("tanh", dtype="float32", name="pinned"))
    with pytest.warns(UserWarning, match=r"compared in float64, but 1 layers pin their own "
                      r"dtype: pinned \(float32\)\. Their rounding"):
        report = sk.check(pinned, data(), strategy=sk.mirrored(cpu_devices(2)))
    assert report.other_dtype_layers == {"pinned": "float32"}
    assert "note: sk.check compared in float64, but 1 layers" in str(report)


def test_weights_pinned_to_another_dtype_are_an_error():
    pinned = pinned_fn(lambda: keras.layers.Dense(1, dtype="float32", name="pinned"))
    with pytest.raises(ValueError, match=r"builds the model in float64, but layers "
                       r"\['pinned'\] pin weights in another dtype, .* Received: "
                       r"dtype='float64', weights in \['float32', 'float64'\]\. Build"):
        sk.check(pinned, data(), strategy=sk.mirrored(cpu_devices(2)))
    report = sk.check(pinned, data(), strategy=sk.mirrored(cpu_devices(2)), dtype=None)
    assert report.passed and report.dtype is None, str(report)


def named_net(loss="mse", local_batch_norm=keras.layers.BatchNormalization):
    """stem -> synced BN -> nested block (middle -> local BN) -> head, all trainable."""
    def model_fn():
        keras.utils.set_random_seed(2)
        block = keras.Sequential([keras.Input((4,)), keras.layers.Dense(4, name="middle"),
                                  local_batch_norm(name="local")], name="block")
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, name="stem"),
                                  sk.SyncBatchNormalization(name="synced"), block,
                                  keras.layers.Dense(1, name="head")])
        model.compile(keras.optimizers.SGD(0.05), loss)
        return model

    return model_fn


def test_the_first_differing_layer_is_where_the_forward_pass_first_differs():
    report = sk.check(named_net(), data(), strategy=sk.mirrored(cpu_devices(2)),
                      global_batch_size=8, steps=3)
    assert not report.passed
    assert list(report.layer_differences) == ["stem", "synced", "block/middle",
                                              "block/local", "head"]
    # Backpropagation through the local BN moves every layer before it too ...
    assert report.layer_differences["stem"] > report.tolerance
    # ... but the forward pass first differs at the unsynchronized one.
    assert report.first_differing_layer == "block/local"
    assert report.first_difference_stage == "forward"
    assert "differences start at layer block/local: its forward state" in str(report)


def test_a_loss_scaled_per_replica_differs_first_in_the_gradients():
    def replica_scaled_mse(y, prediction):  # the classic mistake: N times the gradient
        replicas = tf.distribute.get_strategy().num_replicas_in_sync
        return keras.losses.mean_squared_error(y, prediction) * replicas

    strategy = sk.mirrored(cpu_devices(2))
    synced = sk.check(named_net(local_batch_norm=sk.SyncBatchNormalization), data(),
                      strategy=strategy, global_batch_size=8)
    assert synced.passed, str(synced)
    report = sk.check(named_net(replica_scaled_mse, sk.SyncBatchNormalization), data(),
                      strategy=strategy, global_batch_size=8)
    assert not report.passed
    assert report.first_differing_layer == "stem"
    assert report.first_difference_stage == "gradients"
    assert "differences start at layer stem: the forward pass agrees" in str(report)


def accumulation_model_fn(optimizer_fn, batch_norm=False, synchronized=True):
    def model_fn():
        keras.utils.set_random_seed(1)
        layers = [keras.Input((3,)), keras.layers.Dense(4, activation="tanh")]
        norm = sk.SyncBatchNormalization if synchronized else keras.layers.BatchNormalization
        layers += [norm()] if batch_norm else []
        model = keras.Sequential([*layers, keras.layers.Dense(1)])
        model.compile(optimizer_fn(), "mse")
        return model

    return model_fn


@pytest.mark.parametrize("optimizer_fn", [lambda: keras.optimizers.SGD(0.05, momentum=0.9),
                                          lambda: keras.optimizers.Adam(0.01)],
                         ids=["sgd_momentum", "adam"])
def test_accumulation_on_replicas_equals_one_device_on_the_accumulated_batch(optimizer_fn):
    report = sk.check(accumulation_model_fn(optimizer_fn), data(),
                      strategy=sk.mirrored(cpu_devices(2)), global_batch_size=8, steps=2,
                      gradient_accumulation_steps=3)
    assert report.passed, str(report)
    assert report.gradient_accumulation_steps == 3
    assert str(report).startswith("PASSED: 2 replicas x 4 examples x 3 accumulation steps "
                                  "against 1 device x 8 examples x 3 accumulation steps, "
                                  "2 steps x 2 epochs, in float64\n  covered: whole "
                                  "batches only;")


def test_the_accumulating_reference_equals_one_device_on_the_accumulated_batch():
    # Without batch-dependent layers, 1 device accumulating 3 micro-batches of 8 (the
    # check's reference) is 1 device taking one step on the 24.
    x, y = data()
    weights = []
    for batch, steps in ((24, 1), (8, 3)):
        model = accumulation_model_fn(lambda s=steps: keras.optimizers.Adam(
            0.01, gradient_accumulation_steps=s if s > 1 else None))()
        model.fit(x[:48], y[:48], batch_size=batch, epochs=1, shuffle=False, verbose=0)
        weights.append(model.get_weights())
    for big_batch, accumulated in zip(*weights):
        np.testing.assert_allclose(accumulated, big_batch, atol=1e-6)


@pytest.mark.parametrize(("synchronized", "passed"), [(True, True), (False, False)])
def test_batch_norm_under_accumulation_passes_only_synchronized(synchronized, passed):
    # Both sides normalize each micro-batch of 8: over the 2 replicas' 4 + 4 examples
    # when synchronized, which equals 1 device's micro-batch of 8; per replica otherwise.
    report = sk.check(accumulation_model_fn(lambda: keras.optimizers.SGD(0.05), True,
                                            synchronized), data(),
                      strategy=sk.mirrored(cpu_devices(2)), global_batch_size=8, steps=2,
                      gradient_accumulation_steps=3)
    assert report.passed is passed, str(report)
    if not passed:
        assert report.first_difference_stage == "forward"


@pytest.mark.parametrize("dtype", ["float16", "Float64", True, np.float64])
def test_dtype_must_be_float64_float32_or_none(dtype):
    with pytest.raises(ValueError, match=r"dtype must be one of \('float64', 'float32', "
                       rf"None\)\. Received: dtype={re.escape(repr(dtype))}\. Use \"float64\""):
        sk.check(dense_model, data(), replicas=2, dtype=dtype)


@pytest.mark.parametrize("steps", [0, -2, 2.0, True, "4", None])
def test_gradient_accumulation_steps_must_be_a_positive_int(steps):
    with pytest.raises(ValueError, match=r"gradient_accumulation_steps must be an int >= 1\. "
                       rf"Received: gradient_accumulation_steps={re.escape(repr(steps))}\. "
                       r"Pass 1 \(no accumulation\)"):
        sk.check(dense_model, data(), replicas=2, gradient_accumulation_steps=steps)


def test_too_little_data_for_the_accumulated_steps_is_an_error():
    with pytest.raises(ValueError, match=r"holds 48 examples, fewer than steps x "
                       r"gradient_accumulation_steps x global_batch_size = 3 x 4 x 8\. "
                       r"Received: steps=3, global_batch_size=8, "
                       r"gradient_accumulation_steps=4\. Pass more data"):
        sk.check(dense_model, data(), replicas=2, gradient_accumulation_steps=4)


def test_an_optimizer_that_already_accumulates_is_an_error():
    optimizer_fn = lambda: keras.optimizers.SGD(0.1, gradient_accumulation_steps=2)  # noqa: E731
    with pytest.raises(ValueError, match=r"model_fn's optimizer already accumulates gradients "
                       r"\(gradient_accumulation_steps=2\), and sk.check sets its own on both "
                       r"runs\. Received: gradient_accumulation_steps=3\. Build the optimizer "
                       r"without gradient_accumulation_steps and pass it to sk\.check\."):
        sk.check(accumulation_model_fn(optimizer_fn), data(), replicas=2, steps=1,
                 gradient_accumulation_steps=3)


def test_a_loss_scale_optimizer_cannot_accumulate_in_the_check():
    optimizer_fn = lambda: keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD())  # noqa: E731
    with pytest.raises(ValueError, match=r"cannot add gradient accumulation to a "
                       r"LossScaleOptimizer\. Received: gradient_accumulation_steps=2 with "
                       r"'loss_scale_optimizer(_\d+)?'\. Compile with the inner optimizer"):
        sk.check(accumulation_model_fn(optimizer_fn), data(), replicas=2, steps=1,
                 gradient_accumulation_steps=2)


def weighted_data(examples=48):
    # Weights from 0 to 3, different on every replica's slice; some examples weigh 0.
    x, y = data(examples)
    return x, y, np.arange(examples, dtype="float32") % 4


def regularized_model(**regularizers):
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((3,)),
                              keras.layers.Dense(4, activation="tanh", **regularizers),
                              keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.02), "mse")
    return model


def one_device_fit_loss(model_fn, data, global_batch_size, steps):
    """The loss plain Keras reports on one device in float64 in the second epoch, the data
    passed to fit() as sk.check trains (each epoch's last batch half a global batch;
    float64 weights: Keras draws other initial weights in float32)."""
    keras.config.set_floatx("float64")
    keras.config.set_dtype_policy("float64")
    try:
        examples = steps * global_batch_size - global_batch_size // 2
        x, y, weight = (array[:examples].astype("float64") for array in data)
        history = model_fn().fit(x, y, sample_weight=weight, batch_size=global_batch_size,
                                 epochs=2, shuffle=False, verbose=0)
    finally:
        keras.config.set_floatx("float32")
        keras.config.set_dtype_policy("float32")
    return history.history["loss"][-1]


def test_a_regularized_model_on_weighted_data_passes_in_float64_as_fit_trains_it():
    # Float64 with a regularizer used to fail: a float32 compiled loss next to float64
    # regularization (every Keras), L1's float32 factor (Keras < 3.14).
    model_fn = lambda: regularized_model(kernel_regularizer=keras.regularizers.L1(0.01),  # noqa: E731
                                         bias_regularizer=keras.regularizers.L2(0.01))
    report = sk.check(model_fn, weighted_data(), strategy=sk.mirrored(cpu_devices(4)),
                      global_batch_size=8, steps=3)
    assert report.passed and report.dtype == "float64", str(report)
    assert report.max_difference < 1e-12
    # The loss reported is one device's on the weighted data, as plain Keras reports it
    # (with L1L2(l1=...), whose factor is a float on Keras < 3.14, for L1; L1 holds 0.01
    # rounded to float32, 2e-8 relative: 5e-11 apart at the end on Keras 3.8).
    reference_fn = lambda: regularized_model(  # noqa: E731
        kernel_regularizer=keras.regularizers.L1L2(l1=0.01),
        bias_regularizer=keras.regularizers.L2(0.01))
    assert report.single_device_loss == pytest.approx(
        one_device_fit_loss(reference_fn, weighted_data(), 8, 3), rel=1e-8)
    assert report.distributed_loss == pytest.approx(report.single_device_loss, rel=1e-12)
    assert keras.config.floatx() == "float32"


@pytest.mark.skipif(
    tuple(int(part) for part in keras.__version__.split(".")[:2]) < (3, 14),
    reason="before Keras 3.14 an activity regularizer's term is a sum over the batch, "
    "and on sk.shard's padded final batch (the check evaluates one) it counts the padded "
    "copies: sk.check rightly reports that difference (docs/guides/sharding.md)")
def test_an_activity_regularized_model_on_weighted_data_passes_in_float64():
    # Every replica's activity regularization counts (tests/upstream/test_replica_losses.py).
    model_fn = lambda: regularized_model(activity_regularizer=keras.regularizers.L1(0.01))  # noqa: E731
    report = sk.check(model_fn, weighted_data(), strategy=sk.mirrored(cpu_devices(4)),
                      global_batch_size=8, steps=3)
    assert report.passed, str(report)


class ScaledLossModel(keras.Model):
    """The keras.io "customizing fit()" step, its loss scaled for distribution by hand:
    right gradients (Keras sums the replicas'), and 1/N of the loss reported."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.loss_tracker = keras.metrics.Mean(name="loss")

    @property
    def metrics(self):
        return [self.loss_tracker]

    def train_step(self, data):
        x, y, weight = keras.utils.unpack_x_y_sample_weight(data)
        with tf.GradientTape() as tape:
            prediction = self(x, training=True)
            per_example = keras.losses.mean_squared_error(y[:, None], prediction)
            loss = tf.reduce_mean(per_example) / tf.distribute.get_strategy(
            ).num_replicas_in_sync
        gradients = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(gradients, self.trainable_variables))
        self.loss_tracker.update_state(loss)
        return {"loss": self.loss_tracker.result()}


def scaled_loss_model():
    keras.utils.set_random_seed(1)
    inputs = keras.Input((3,))
    outputs = keras.layers.Dense(1)(keras.layers.Dense(4, activation="tanh")(inputs))
    model = ScaledLossModel(inputs, outputs)
    model.compile(keras.optimizers.SGD(0.05), "mse")
    return model


def test_a_train_step_reporting_a_quarter_of_its_loss_on_4_replicas_fails_named():
    report = sk.check(scaled_loss_model, data(), strategy=sk.mirrored(cpu_devices(4)),
                      global_batch_size=8, steps=3)
    assert report.weights_agree, str(report)  # its gradients are right
    assert not report.passed
    assert report.first_differing_log == "loss"
    assert report.distributed_logs["loss"] == pytest.approx(
        report.single_device_logs["loss"] / 4, rel=1e-12)
    assert re.search(r"first value fit\(\) reported that differs: loss: 1 device [\d.]+, "
                     r"4 replicas [\d.]+\n  loss on 4 replicas is 1/4 of one device's: the "
                     r"train_step reports a loss scaled for distribution .* Report the "
                     r"unscaled loss: update the tracker with the loss times "
                     r"tf\.distribute\.get_strategy\(\)\.num_replicas_in_sync", str(report))


def random_model():
    keras.utils.set_random_seed(1)
    block = keras.Sequential([keras.Input((4,)), keras.layers.GaussianNoise(0.3, name="noise"),
                              keras.layers.Dense(4, activation="tanh")], name="block")
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="tanh"),
                              keras.layers.Dropout(0.5, name="drop"), block,
                              keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.05), "mse")
    return model


def test_random_layers_are_switched_off_on_both_sides_and_named():
    report = sk.check(random_model, data(), strategy=sk.mirrored(cpu_devices(4)),
                      global_batch_size=8, steps=3)
    assert report.passed and report.max_difference < 1e-12, str(report)
    assert report.random_layers == {"drop": "Dropout", "block/noise": "GaussianNoise"}
    assert ("randomness off in 2 layers: drop (Dropout), block/noise (GaussianNoise); both "
            "runs computed them as in inference") in str(report)


@pytest.mark.slow
def test_the_float64_check_prints_no_tensorflow_lines_and_restores_the_optimizer(tmp_path):
    # TensorFlow's remapper logged `util.cc:163] Not handling type DT_DOUBLE` for each
    # float64 op it could have fused: 36 lines for this check. A fresh process (not
    # `run_python`'s fork): TensorFlow reads TF_CPP_MIN_LOG_LEVEL once, the suite sets 2.
    package = os.path.dirname(sk.__file__)  # this checkout's, also in a matrix virtualenv
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent("""
        import keras, numpy as np, tensorflow as tf
        import strategykit as sk
        def model_fn():
            model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, "tanh"),
                                      keras.layers.Dense(1)])
            model.compile("sgd", "mse")
            return model
        x = np.linspace(0, 1, 24).reshape(8, 3)
        before = tf.config.optimizer.get_experimental_options()
        print(bool(sk.check(model_fn, (x, x.sum(1)), replicas=2, steps=1)))
        print(tf.config.optimizer.get_experimental_options() == {**before, "remapping": True})
        """))
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                            timeout=240, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "0",
                                              "PYTHONPATH": os.path.dirname(package)})
    assert result.stderr.count("Not handling type") == 0, result.stderr[-3000:]
    assert result.stdout.split("\n")[:2] == ["True", "True"], result.stdout + result.stderr
