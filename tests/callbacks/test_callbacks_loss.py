"""CrossReplicaLoss: every replica's loss and its reductions, in logs, History, CSV, TensorBoard.

Most models here predict 0 (zero weights, learning rate 0), so each example's squared
error is y**2 and every expected value can be written by hand. Each global batch of 8
is split over 4 replicas in order: replica k gets examples 2k and 2k+1.
"""

import csv
import glob

import keras
import numpy as np
import pytest
import tensorflow as tf

import strategykit as sk
from strategykit import callbacks

from conftest import ZeroSubclassed


class Recorder(keras.callbacks.Callback):
    """Keeps copies of the logs the callbacks after CrossReplicaLoss receive."""

    def __init__(self):
        super().__init__()
        self.batches, self.epochs, self.test_end = [], [], None

    def on_train_batch_end(self, batch, logs=None):
        self.batches.append(dict(logs))

    def on_epoch_end(self, epoch, logs=None):
        self.epochs.append(dict(logs))

    def on_test_end(self, logs=None):
        self.test_end = dict(logs)


def zero_model(strategy=None, learning_rate=0.0):
    with (strategy or tf.distribute.get_strategy()).scope():
        model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1, "linear", False,
                                                                        "zeros")])
        model.compile(keras.optimizers.SGD(learning_rate), "mse")
    return model


def replica0_hundred(batches=2):
    """Replica 0's examples have y = 10 (loss 100); every other replica's y = 0."""
    y = np.zeros((8 * batches, 1), "float32")
    for b in range(batches):
        y[8 * b: 8 * b + 2] = 10.0
    return np.ones_like(y), y


@pytest.fixture(scope="module")
def hundred_run(tmp_path_factory):
    """One fit with validation, CSVLogger and TensorBoard after CrossReplicaLoss."""
    folder = tmp_path_factory.mktemp("hundred")
    strategy = sk.mirrored([f"/cpu:{i}" for i in range(4)])
    model = zero_model(strategy)
    x, y = replica0_hundred()
    recorder = Recorder()
    history = model.fit(
        x, y, batch_size=8, epochs=2, verbose=0, shuffle=False, validation_data=(x, y),
        callbacks=[callbacks.CrossReplicaLoss(), recorder,
                   keras.callbacks.CSVLogger(str(folder / "log.csv")),
                   keras.callbacks.TensorBoard(str(folder / "tb"))],
    )
    return history.history, recorder, folder, model


EXPECTED = {"loss/replica_0": 100.0, "loss/replica_1": 0.0, "loss/replica_2": 0.0,
            "loss/replica_3": 0.0, "loss/mean": 25.0, "loss/min": 0.0, "loss/max": 100.0,
            "loss/std": np.sqrt((75.0**2 + 3 * 25.0**2) / 4)}


def test_each_replicas_loss_and_reductions_per_batch_and_epoch(hundred_run):
    history, recorder, _, _ = hundred_run
    for logs in recorder.batches + recorder.epochs:
        for key, value in EXPECTED.items():
            assert logs[key] == pytest.approx(value), key
    for key, value in EXPECTED.items():
        assert history[key] == pytest.approx([value, value]), key
        assert history[f"val_{key}"] == pytest.approx([value, value]), key
    assert history["loss"] == pytest.approx([25.0, 25.0])  # Keras's own value is untouched


def test_values_reach_csv_logger(hundred_run):
    _, _, folder, _ = hundred_run
    with open(folder / "log.csv") as file:
        rows = list(csv.DictReader(file))
    assert len(rows) == 2
    for row in rows:
        for key, value in EXPECTED.items():
            assert float(row[key]) == pytest.approx(value), key
            assert float(row[f"val_{key}"]) == pytest.approx(value), key


def _tensorboard_scalars(folder):
    """`{(run, tag): [values]}` of the epoch scalars in the event files under `folder`."""
    scalars = {}
    for path in glob.glob(str(folder / "**" / "events.out.tfevents.*"), recursive=True):
        run = "validation" if "validation" in path else "train"
        for record in tf.data.TFRecordDataset(path):
            event = tf.compat.v1.Event.FromString(record.numpy())
            for value in event.summary.value:
                if value.tag.startswith("epoch_"):
                    scalars.setdefault((run, value.tag), []).append(
                        float(tf.make_ndarray(value.tensor)))
    return scalars


def test_values_reach_tensorboard_event_files(hundred_run):
    pytest.importorskip("tensorboard")
    _, _, folder, _ = hundred_run
    scalars = _tensorboard_scalars(folder / "tb")
    for key, value in EXPECTED.items():
        for run in ("train", "validation"):
            assert scalars[(run, f"epoch_{key}")] == pytest.approx([value, value]), (run, key)


def test_model_steps_are_restored_after_fit(hundred_run):
    *_, model = hundred_run
    assert not {"train_step", "test_step", "compute_loss"} & set(vars(model))


def padded_dataset():
    """3 global batches of 8; the last has 3 padded examples, as sk.shard pads: weight
    -0.0 (and a huge y here), its 5 real examples weighed 8 / 5.

    Replica 0 sees 2 real examples of the last batch, replicas 1-3 one each.
    """
    y = np.arange(1, 25, dtype="float32")[:, None]
    weights = np.ones(24, "float32")
    weights[16:] = 8 / 5
    for padded in (19, 21, 23):
        weights[padded], y[padded] = -0.0, 1000.0
    x = np.ones_like(y)
    return tf.data.Dataset.from_tensor_slices((x, y, weights)).batch(8), y[:, 0], weights


def replica_rows(batch, replica):
    return [8 * batch + 2 * replica, 8 * batch + 2 * replica + 1]


def test_epoch_values_are_exact_over_real_examples_with_padded_final_batch(make_strategy):
    dataset, y, weights = padded_dataset()
    model = zero_model(make_strategy(4))
    recorder = Recorder()
    model.fit(dataset, epochs=1, verbose=0, shuffle=False,
              callbacks=[callbacks.CrossReplicaLoss(), recorder])
    values, counts = [], []
    for replica in range(4):
        rows = [r for b in range(3) for r in replica_rows(b, replica) if weights[r] > 0]
        values.append(np.mean(y[rows] ** 2))
        counts.append(len(rows))
    logs = recorder.epochs[0]
    for replica in range(4):
        assert logs[f"loss/replica_{replica}"] == pytest.approx(values[replica], rel=1e-6)
    real = weights > 0
    assert logs["loss/mean"] == pytest.approx(np.mean(y[real] ** 2), rel=1e-6)
    assert logs["loss/max"] == pytest.approx(max(values), rel=1e-6)
    assert logs["loss/min"] == pytest.approx(min(values), rel=1e-6)
    assert logs["loss/std"] == pytest.approx(
        np.sqrt(np.average((np.array(values) - np.mean(y[real] ** 2)) ** 2, weights=counts)),
        rel=1e-6)
    # So does Keras's own loss (strategykit.upstream.exact_metrics).
    assert logs["loss"] == pytest.approx(np.mean(y[real] ** 2), rel=1e-6)
    # After the first batch (no padding yet) the running values are that batch's.
    first = recorder.batches[0]
    for replica in range(4):
        assert first[f"loss/replica_{replica}"] == pytest.approx(
            np.mean(y[replica_rows(0, replica)] ** 2), rel=1e-6)


def test_epoch_values_are_exact_on_sk_shard_data_whose_final_batch_is_padded(make_strategy):
    # sk.shard pads the final batch (45 = 5 x 8 + 5) with weight-0 copies and weighs its
    # 5 real examples 8 / 5 each: the epoch values are still those of the 45 examples.
    strategy = make_strategy(4)
    y = np.linspace(-2.0, 3.0, 45).astype("float32")
    model = zero_model(strategy)
    history = model.fit(sk.shard((np.zeros((45, 1), "float32"), y), strategy,
                                 global_batch_size=8), epochs=1, verbose=0,
                        callbacks=[callbacks.CrossReplicaLoss()]).history
    assert history["loss/mean"][0] == pytest.approx(np.mean(y ** 2), rel=1e-6)
    # Replica k holds rows 2k, 2k + 1 of each full batch and, of the final 5 examples
    # (40..44), replica 0 gets 40, 41 and the others one each.
    final = {0: [40, 41], 1: [42], 2: [43], 3: [44]}
    for replica in range(4):
        rows = [8 * b + 2 * replica + i for b in range(5) for i in range(2)] + final[replica]
        assert history[f"loss/replica_{replica}"][0] == pytest.approx(
            np.mean(y[rows] ** 2), rel=1e-6)


def test_mean_equals_keras_loss_while_training_without_padding(make_strategy):
    rng = np.random.default_rng(3)
    x = rng.normal(size=(32, 2)).astype("float32")
    y = (x @ [[1.0], [2.0]] + np.repeat([0.0, 1.0, 2.0, 3.0], 8)[:, None]).astype("float32")
    with make_strategy(4).scope():
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        model.compile(keras.optimizers.SGD(0.05), "mse")
    recorder = Recorder()
    history = model.fit(x, y, batch_size=8, epochs=2, verbose=0, validation_data=(x, y),
                        callbacks=[callbacks.CrossReplicaLoss(), recorder]).history
    assert history["loss/mean"] == pytest.approx(history["loss"], rel=1e-5)
    assert history["val_loss/mean"] == pytest.approx(history["val_loss"], rel=1e-5)
    assert history["loss/max"][0] > history["loss/min"][0]


def test_mean_equals_keras_loss_and_one_devices_on_padded_weighted_data(make_strategy):
    # 45 = 5 x 8 + 5 examples, user weights with zeros (they count in Keras's loss, as on
    # one device), validation of 19 (a final batch of 3 < 4 replicas).
    rng = np.random.default_rng(4)
    x = rng.normal(size=(45, 2)).astype("float32")
    y = (x @ [[1.0], [2.0]] + rng.normal(size=(45, 1))).astype("float32")
    w = rng.choice([0.0, 1.0, 2.5], size=45).astype("float32")

    def build():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        model.compile(keras.optimizers.SGD(0.05), "mse")
        return model

    expected = build().fit(x, y, sample_weight=w, batch_size=8, epochs=2, verbose=0,
                           shuffle=False, validation_data=(x[:19], y[:19], w[:19])).history
    strategy = make_strategy(4)
    with strategy.scope():
        model = build()
    shard = lambda *data: sk.shard(data, strategy, global_batch_size=8)  # noqa: E731
    history = model.fit(shard(x, y, w), epochs=2, verbose=0,
                        validation_data=shard(x[:19], y[:19], w[:19]),
                        callbacks=[callbacks.CrossReplicaLoss()]).history
    for key in ("loss", "val_loss"):
        assert history[key] == pytest.approx(expected[key], rel=1e-5)
        assert history[f"{key}/mean"] == pytest.approx(history[key], rel=1e-5)


def test_one_device_reports_one_replica():
    x, y = replica0_hundred()
    model = zero_model(learning_rate=0.01)
    recorder = Recorder()
    history = model.fit(x, y * np.arange(16)[:, None], batch_size=8, epochs=2, verbose=0,
                        callbacks=[callbacks.CrossReplicaLoss(), recorder]).history
    assert history["loss/replica_0"] == pytest.approx(history["loss"], rel=1e-5)
    assert history["loss/mean"] == pytest.approx(history["loss"], rel=1e-5)
    assert history["loss/std"] == [0.0, 0.0]
    assert "loss/replica_1" not in history and "replica_drift" not in history


class CustomTrainStep(ZeroSubclassed):
    """A custom train_step as in the Keras guide, computing its loss with compute_loss."""

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self.compute_loss(y=y, y_pred=y_pred)
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
        for metric in self.metrics:
            if metric.name == "loss":
                metric.update_state(loss)
        return {metric.name: metric.result() for metric in self.metrics}


def functional():
    inputs = keras.Input((1,))
    return keras.Model(inputs, keras.layers.Dense(1, use_bias=False,
                                                  kernel_initializer="zeros")(inputs))


@pytest.mark.parametrize("build", [functional, ZeroSubclassed, CustomTrainStep],
                         ids=["functional", "subclassed", "custom_train_step"])
def test_every_kind_of_model(make_strategy, build):
    with make_strategy(2).scope():
        model = build()
        model.compile(keras.optimizers.SGD(0.0), "mse")
    y = np.array([[1.0], [2.0], [3.0], [4.0], [5.0], [6.0], [7.0], [8.0]], "float32")
    history = model.fit(np.ones_like(y), y, batch_size=4, epochs=1, verbose=0, shuffle=False,
                        callbacks=[callbacks.CrossReplicaLoss()]).history
    # Replica 0 sees y = 1, 2, 5, 6; replica 1 sees 3, 4, 7, 8.
    assert history["loss/replica_0"] == pytest.approx([np.mean([1, 4, 25, 36])])
    assert history["loss/replica_1"] == pytest.approx([np.mean([9, 16, 49, 64])])
    assert history["loss/mean"] == pytest.approx([np.mean(y**2)])


class HandWrittenLoss(ZeroSubclassed):
    def train_step(self, data):
        x, y = data
        loss = tf.reduce_mean((self(x) - y) ** 2)
        return {"loss": loss}


def test_step_without_compute_loss_is_explained(make_strategy):
    with make_strategy(2).scope():
        model = HandWrittenLoss()
        model.compile("sgd", "mse")
    y = np.ones((8, 1), "float32")
    with pytest.raises(ValueError, match=r"never called self\.compute_loss\(\.\.\.\) nor "
                       r"added a loss to a keras\.metrics\.Mean.*Compute the loss"):
        model.fit(y, y, batch_size=4, verbose=0, callbacks=[callbacks.CrossReplicaLoss()])


class GAN(keras.Model):
    """keras.io's GAN ("Customizing what happens in fit()"), small: two optimizers, a
    Loss object, one Mean tracker per loss, no call()."""

    def __init__(self, latent_dim=2):
        super().__init__()
        self.latent_dim = latent_dim
        self.discriminator = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        self.generator = keras.Sequential([keras.Input((latent_dim,)), keras.layers.Dense(3)])
        self.d_loss_tracker = keras.metrics.Mean(name="d_loss")
        self.g_loss_tracker = keras.metrics.Mean(name="g_loss")

    @property
    def metrics(self):
        return [self.d_loss_tracker, self.g_loss_tracker]

    def compile(self, d_optimizer, g_optimizer, loss_fn):
        super().compile()
        self.d_optimizer, self.g_optimizer, self.loss_fn = d_optimizer, g_optimizer, loss_fn

    def train_step(self, real):
        real = real[0] if isinstance(real, tuple) else real
        batch = tf.shape(real)[0]
        noise = tf.random.normal((batch, self.latent_dim))
        images = tf.concat([self.generator(noise), real], axis=0)
        labels = tf.concat([tf.ones((batch, 1)), tf.zeros((batch, 1))], axis=0)
        with tf.GradientTape() as tape:
            d_loss = self.loss_fn(labels, self.discriminator(images))
        grads = tape.gradient(d_loss, self.discriminator.trainable_weights)
        self.d_optimizer.apply_gradients(zip(grads, self.discriminator.trainable_weights))
        with tf.GradientTape() as tape:
            fooled = self.discriminator(self.generator(tf.random.normal((batch, 2))))
            g_loss = self.loss_fn(tf.zeros((batch, 1)), fooled)
        grads = tape.gradient(g_loss, self.generator.trainable_weights)
        self.g_optimizer.apply_gradients(zip(grads, self.generator.trainable_weights))
        self.d_loss_tracker.update_state(d_loss)
        self.g_loss_tracker.update_state(g_loss)
        return {"d_loss": self.d_loss_tracker.result(), "g_loss": self.g_loss_tracker.result()}


def test_a_gans_losses_are_logged_for_each_replica(make_strategy):
    keras.utils.set_random_seed(0)  # the weights and noise: d_loss's range below holds
    with make_strategy(4).scope():
        gan = GAN()
        gan.compile(keras.optimizers.Adam(1e-3), keras.optimizers.Adam(1e-3),
                    keras.losses.BinaryCrossentropy(from_logits=True))
    # Each replica's real examples differ: its discriminator loss differs.
    real = np.repeat(np.arange(4, dtype="float32"), 2)[:, None] * np.ones((1, 3), "float32")
    history = gan.fit(real, batch_size=8, epochs=2, verbose=0,
                      callbacks=[callbacks.CrossReplicaLoss()]).history
    for name in ("d_loss", "g_loss"):
        replicas = np.array([history[f"{name}/replica_{k}"] for k in range(4)])
        np.testing.assert_allclose(history[f"{name}/mean"], replicas.mean(axis=0), rtol=1e-6)
        # The tracker reports the mean of the replicas' losses, as one device would (not
        # a quarter of it: keras-team's scaled loss, see upstream/reported_losses.py).
        np.testing.assert_allclose(history[name], history[f"{name}/mean"], rtol=1e-5)
        assert history[f"{name}/max"] >= history[f"{name}/min"]
    assert len(set(np.array([history[f"d_loss/replica_{k}"][0] for k in range(4)]))) == 4
    assert not [key for key in history if key.startswith("loss")]  # no compiled loss
    assert 0.3 < history["d_loss"][0] < 3  # about log 2 for an untrained discriminator


def test_standalone_evaluate_and_chosen_reductions(make_strategy):
    model = zero_model(make_strategy(4))
    x, y = replica0_hundred()
    recorder = Recorder()
    result = model.evaluate(x, y, batch_size=8, verbose=0, return_dict=True, callbacks=[
        callbacks.CrossReplicaLoss(reductions=("sum", "max"), per_replica=False), recorder])
    assert result == {"loss": 25.0}
    assert recorder.test_end == {"loss": 25.0, "loss/sum": 100.0, "loss/max": 100.0}
    assert not {"test_step", "compute_loss"} & set(vars(model))


@pytest.mark.parametrize("reductions", ["mean", ("mean", "median")])
def test_unknown_reductions_are_refused(reductions):
    with pytest.raises(ValueError, match=r"reductions must be a list of reductions\. "
                                         r"Received: reductions=.*Use any of 'mean'"):
        callbacks.CrossReplicaLoss(reductions=reductions)


def test_unknown_on_nan_is_refused():
    with pytest.raises(ValueError, match=r"Unknown on_nan\. Received: on_nan='warn'\. "
                                         r"Use one of 'stop', 'raise', 'ignore'"):
        callbacks.CrossReplicaLoss(on_nan="warn")


def test_progress_bar_shows_the_values(hundred_run, capsys):
    # hundred_run's model (learning rate 0, so still predicting 0): fit() again on the same
    # data traces nothing again.
    *_, model = hundred_run
    capsys.readouterr()
    model.fit(*replica0_hundred(), batch_size=8, epochs=1, verbose=2, shuffle=False,
              callbacks=[callbacks.CrossReplicaLoss(reductions=("max",), progress="all")])
    out = capsys.readouterr().out
    assert "loss/replica_0: 100.0000" in out and "loss/max: 100.0000" in out
