"""Models of a user's own, trained with strategykit's fixes installed and without them.

Run in a process of its own (`test_only_ours.py`): a plain `tf.distribute.MirroredStrategy`
and strategykit's strategies in one process share TensorFlow's collective keys, and a
synchronized batch norm of one then waits on the other's. `compare(where)` trains the
workload twice, with the fixes installed and after `upstream.uninstall()`, and raises
AssertionError where anything differs.
"""

import keras
import numpy as np
import tensorflow as tf

import strategykit as sk
from strategykit import upstream
from strategykit.made import strategies

EXAMPLES = 61  # not a multiple of the batch of 16


def _data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(EXAMPLES, 3)).astype("float32")
    y = (x @ np.array([[10.0], [-20.0], [5.0]], "float32")
         + 30 * rng.normal(size=(EXAMPLES, 1)).astype("float32"))
    weights = rng.uniform(0.5, 2.0, size=EXAMPLES).astype("float32")
    return x, y, weights


class _ReportsItsLoss(keras.Model):
    """keras.io's custom train_step: the loss reported through a Mean metric."""

    def __init__(self):
        super().__init__(name="reports_its_loss")
        self.hidden = keras.layers.Dense(4, activation="tanh",
                                         activity_regularizer=keras.regularizers.L2(0.01))
        self.norm = keras.layers.BatchNormalization()
        self.out = keras.layers.Dense(1)
        self.loss_tracker = keras.metrics.Mean(name="loss")

    def call(self, x, training=False):
        return self.out(self.norm(self.hidden(x), training=training))

    @property
    def metrics(self):
        return [self.loss_tracker]

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = self.compute_loss(x=x, y=y, y_pred=self(x, training=True))
        gradients = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(gradients, self.trainable_variables))
        self.loss_tracker.update_state(loss)
        return {"loss": self.loss_tracker.result()}


def train(strategy) -> dict:
    """Two models trained under `strategy`: their weights, logs and callbacks."""
    x, y, weights = _data()
    keras.utils.set_random_seed(0)
    with strategy.scope():
        plain = keras.Sequential([
            keras.Input((3,)),
            keras.layers.Dense(4, activation="tanh",
                               activity_regularizer=keras.regularizers.L2(0.01)),
            keras.layers.BatchNormalization(synchronized=True), keras.layers.Dense(1)])
        plain.compile(keras.optimizers.SGD(0.1, global_clipnorm=0.1), "mse",
                      metrics=["mae"], weighted_metrics=["mse"])
        custom = _ReportsItsLoss()
        custom.compile(keras.optimizers.Adam(0.01, clipnorm=0.1), "mse")
    plain_logs = plain.fit(x, y, sample_weight=weights, batch_size=16, epochs=2,
                           verbose=0).history
    custom_logs = custom.fit(x, y, batch_size=16, epochs=2, verbose=0).history
    evaluated = plain.evaluate(x, y, sample_weight=weights, batch_size=16, verbose=0)
    return {
        "weights": [w for model in (plain, custom) for w in model.get_weights()],
        "logs": [plain_logs, custom_logs, evaluated],
        "callbacks": [type(c).__name__ for c in
                      keras.callbacks.CallbackList([], model=plain).callbacks],
    }


def in_use() -> None:
    """strategykit in use in the process: its strategy trained on its padded data."""
    strategy = sk.mirrored(replicas=2)
    x, y, _ = _data()
    with strategy.scope():
        model = keras.Sequential([keras.Input((3,)),
                                  keras.layers.BatchNormalization(synchronized=True),
                                  keras.layers.Dense(1)])
        model.compile(keras.optimizers.SGD(global_clipnorm=0.1), "mse")
    model.fit(sk.shard((x, y), strategy, global_batch_size=16), epochs=1, verbose=0)


def compare(where: str) -> None:
    """Trains the workload under a MirroredStrategy of the user's (`where="mirrored"`) or
    on one device (`"one device"`), with strategykit in use, with and without its fixes."""
    in_use()
    strategy = (tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]) if where == "mirrored"
                else tf.distribute.get_strategy())
    with_fixes = train(strategy)
    upstream.uninstall()
    try:
        without = train(strategy)
    finally:
        upstream.install()
    for ours, keras_own in zip(with_fixes["weights"], without["weights"], strict=True):
        np.testing.assert_array_equal(ours, keras_own)
    assert with_fixes["logs"] == without["logs"], (with_fixes["logs"], without["logs"])
    assert without["callbacks"] == []
    # strategykit's callbacks join no fit of these models; on one device only the position
    # tracker of sk.shard's data, once sk.shard sharded data for one device (it reads and
    # changes nothing of the model: the weights and logs above are Keras's own).
    one_device_data = strategies.sharded_for(strategy) and not strategies.is_ours(strategy)
    assert with_fixes["callbacks"] == (["EpochTracker"] if one_device_data else []), \
        with_fixes["callbacks"]
