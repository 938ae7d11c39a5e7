"""The NaN guard of CrossReplicaLoss: which replica, when, and the weights before the step."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from strategykit import callbacks
from strategykit.callbacks.replica_drift import replica_copies
from strategykit.upstream import epoch_input

BAD_BATCH, BAD_REPLICA = 2, 2


class WeightsBeforeBatch(keras.callbacks.Callback):
    """Keeps the weights (and the optimizer's step count) before every batch."""

    def __init__(self):
        super().__init__()
        self.before = []

    def on_train_batch_begin(self, batch, logs=None):
        self.before.append((self.model.get_weights(), int(self.model.optimizer.iterations.numpy())))


def nan_in_replica_2():
    """4 global batches of 8 on 4 replicas; one NaN input in replica 2's shard of batch 2."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 2)).astype("float32")
    y = (x @ [[1.0], [-1.0]] + 0.5).astype("float32")
    x[8 * BAD_BATCH + 2 * BAD_REPLICA, 0] = np.nan
    return x, y


def trained_model(strategy):
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        model.compile(keras.optimizers.SGD(0.1, momentum=0.9), "mse")
    return model


def test_stop_names_the_replica_and_restores_the_weights_before_the_bad_step(make_strategy):
    strategy = make_strategy(4)
    model = trained_model(strategy)
    x, y = nan_in_replica_2()
    weights = WeightsBeforeBatch()
    guard = callbacks.CrossReplicaLoss()
    with pytest.warns(RuntimeWarning, match=r"Non-finite loss on replica 2 \(nan\) of 4 at "
                                            r"epoch 0, batch 2\..*weights from before"):
        history = model.fit(x, y, batch_size=8, epochs=3, verbose=0, shuffle=False,
                            callbacks=[weights, guard])
    assert len(weights.before) == BAD_BATCH + 1  # stopped right after the bad batch
    assert len(history.history["loss"]) == 1
    assert "replica 2" in guard.nan_report
    expected, iterations = weights.before[BAD_BATCH]
    assert iterations == BAD_BATCH
    for variable, value in zip(model.weights, expected):
        for copy in replica_copies(variable, strategy):  # every replica's copy
            np.testing.assert_array_equal(copy, value)
    assert int(model.optimizer.iterations.numpy()) == BAD_BATCH  # optimizer variables too
    for variable in model.optimizer.variables:
        for copy in replica_copies(variable, strategy):
            assert np.all(np.isfinite(copy))
    assert not {"train_step", "test_step", "compute_loss"} & set(vars(model))


def test_raise_names_the_replica_and_leaves_the_model_clean(make_strategy):
    model = trained_model(make_strategy(4))
    x, y = nan_in_replica_2()
    with pytest.raises(callbacks.NonFiniteError,
                       match=r"Non-finite loss on replica 2 \(nan\) of 4 at epoch 0, batch 2"):
        model.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False,
                  callbacks=[callbacks.CrossReplicaLoss(on_nan="raise")])
    assert not {"train_step", "test_step", "compute_loss"} & set(vars(model))


def test_ignore_keeps_training_and_logs_the_nan(make_strategy):
    model = trained_model(make_strategy(4))
    x, y = nan_in_replica_2()
    history = model.fit(x, y, batch_size=8, epochs=2, verbose=0, shuffle=False,
                        callbacks=[callbacks.CrossReplicaLoss(on_nan="ignore")]).history
    assert len(history["loss"]) == 2
    assert np.isnan(history["loss/replica_2"][0])


class PoisonReplica1MovingMean(keras.callbacks.Callback):
    """Puts a NaN into replica 1's copy of the batch norm moving mean: the loss stays finite."""

    def on_epoch_begin(self, epoch, logs=None):
        moving_mean = self.model.layers[0].moving_mean
        copy = self.model.distribute_strategy.experimental_local_results(moving_mean.value)[1]
        copy.assign(tf.fill(copy.shape, np.nan))


@pytest.mark.parametrize("on_nan", ["raise", "stop"])
def test_non_finite_moving_statistics_on_one_replica_are_found(make_strategy, on_nan):
    with make_strategy(2).scope():
        model = keras.Sequential([keras.Input((2,)), keras.layers.BatchNormalization(),
                                  keras.layers.Dense(1)])
        model.compile("sgd", "mse")
    x = np.arange(16, dtype="float32").reshape(8, 2)
    fit = lambda: model.fit(  # noqa: E731
        x, x[:, :1], batch_size=4, epochs=2, verbose=0, shuffle=False,
        callbacks=[PoisonReplica1MovingMean(), callbacks.CrossReplicaLoss(on_nan=on_nan)])
    pattern = r"Non-finite values in 1 weight copies at the end of epoch 0: .*moving_mean " \
              r"\(replica 1\)"
    if on_nan == "raise":
        with pytest.raises(callbacks.NonFiniteError, match=pattern):
            fit()
    else:
        with pytest.warns(RuntimeWarning, match=pattern + r".*Training stopped"):
            history = fit()
        assert np.isfinite(history.history["loss"][0])  # the loss never saw it
        assert len(history.history["loss"]) == 1


@pytest.mark.filterwarnings("ignore:Non-finite values in")  # the unrestored NaN weights
def test_stop_with_several_steps_per_execution_says_it_cannot_restore():
    # One device: Keras 3.15's steps_per_execution loop fails under MirroredStrategy.
    model = trained_model(tf.distribute.get_strategy())
    model.compile(keras.optimizers.SGD(0.1), "mse", steps_per_execution=2)
    x, y = nan_in_replica_2()
    # Keras reports an execution of steps 2 and 3 by its last step (by its first on 3.8).
    batch = 3 if epoch_input.yields_last_step() else 2
    with pytest.warns(RuntimeWarning, match=rf"replica 0 \(nan\) of 1 at epoch 0, batch {batch}\. "
                                            r".*without restoring the weights: with "
                                            r"steps_per_execution=2"):
        model.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False,
                  callbacks=[callbacks.CrossReplicaLoss()])
