"""keras.io's LSTM weather forecaster, on data of a size tf.data does not know.

The example (keras.io/examples/timeseries/timeseries_weather_forecasting) makes its
windows with `keras.utils.timeseries_dataset_from_array`, batched; `sk.shard` takes it
unbatched (`.unbatch()`), and tf.data no longer knows its size. Keras ends an epoch of
such data by calling its step once more, and that call, failing at `get_next`, still
counts a step on the optimizer (`iterations`): Adam then runs a step ahead on N replicas
from the second epoch on (1.3e-4 off one device here). The data is not a multiple of
the global batch (every epoch ends with a partial, padded batch), and the windows of each
replica differ.
"""

import keras
import numpy as np
import pytest

import strategykit as sk
from strategykit.data import sharding

from conftest import cpu_devices

FEATURES, PAST, FUTURE, STEP = 3, 6, 10, 2


def climate(rows=400):
    """Weather-like features: random walks, normalized as keras.io normalizes them."""
    walk = np.cumsum(np.random.default_rng(0).normal(size=(rows, FEATURES)), axis=0)
    return (walk - walk.mean(0)) / walk.std(0)


def windows(batch_size=256):
    """The example's dataset: windows of the past, the first feature FUTURE rows ahead."""
    features = climate()
    return keras.utils.timeseries_dataset_from_array(
        features[:-FUTURE], features[FUTURE:, :1], sequence_length=PAST,
        sampling_rate=STEP, batch_size=batch_size)


def forecaster():
    """The example's model, smaller (LSTM(32) there)."""
    keras.utils.set_random_seed(0)
    inputs = keras.layers.Input(shape=(PAST, FEATURES))
    lstm_out = keras.layers.LSTM(8)(inputs)
    outputs = keras.layers.Dense(1)(lstm_out)
    model = keras.Model(inputs=inputs, outputs=outputs)
    model.compile(optimizer=keras.optimizers.Adam(learning_rate=0.001), loss="mse")
    return model


@pytest.fixture
def without_the_fix(monkeypatch):
    """sk.shard data of unknown size read by Keras's own epochs (the step past the end)."""
    attach = sharding.attach_stream
    monkeypatch.setattr(sharding, "attach_stream", lambda distributed, stream: None if isinstance(
        stream, sharding.PassEachEpoch) else attach(distributed, stream))


@pytest.mark.slow
def test_the_forecaster_on_4_replicas_trains_as_one_device_over_epochs(float64):
    strategy = sk.mirrored(cpu_devices(4))
    one = forecaster()
    initial = one.get_weights()
    one.fit(windows(batch_size=16), epochs=3, verbose=0)
    with strategy.scope():
        model = forecaster()
    model.set_weights(initial)
    data = windows().unbatch()
    assert int(data.cardinality()) < 0  # unknown to tf.data
    history = model.fit(sk.shard(data, strategy, global_batch_size=16), epochs=3, verbose=0)

    assert int(model.optimizer.iterations.numpy()) == int(one.optimizer.iterations.numpy())
    # 380 windows an epoch: 23 steps of 16 and one of 12
    assert int(one.optimizer.iterations.numpy()) == 3 * 24
    for found, expected in zip(model.get_weights(), one.get_weights()):
        np.testing.assert_allclose(found, expected, rtol=0, atol=1e-12)
    assert np.isfinite(history.history["loss"]).all()


@pytest.mark.slow
def test_sk_check_of_the_forecasters_dataset_passes_and_says_what_it_covered():
    report = sk.check(forecaster, windows().unbatch(), strategy=sk.mirrored(cpu_devices(4)))
    assert report.passed, str(report)
    assert report.epochs == 2 and report.partial_batch == 8 and report.fed_dataset
    assert report.optimizer_steps == (6, 6)
    assert ("3 steps x 2 epochs, in float64\n  covered: the last step of each epoch a "
            "partial batch (8 of 16 examples, padded on 4 replicas); the N replicas read "
            "sk.shard of your dataset as it is") in str(report)


@pytest.mark.slow
def test_sk_check_fails_the_forecaster_where_a_step_runs_past_the_end(without_the_fix):
    report = sk.check(forecaster, windows().unbatch(), strategy=sk.mirrored(cpu_devices(4)))
    assert not report.passed and report.max_difference > 1e-5
    assert report.optimizer_steps == (6, 8)
    assert ("the optimizers counted other steps: 1 device 6, 4 replicas 8 "
            "(optimizer.iterations") in str(report)
    assert "Look for loss scaled" not in str(report)  # not the generic hint


def test_epochs_must_be_a_positive_int():
    with pytest.raises(ValueError, match=r"epochs must be a positive int\. Received: "
                                         r"epochs=0\. Pass e\.g\. epochs=2\."):
        sk.check(forecaster, windows().unbatch(), epochs=0)
