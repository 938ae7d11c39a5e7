"""strategykit's fixes touch only the strategies and data strategykit made.

A notebook that uses strategykit may train other Keras models too: on one device, or
under a `tf.distribute.MirroredStrategy` of its own. Those must run as if strategykit
were not imported, though its fixes are installed (`strategykit.made.strategies`).
Each workload below is one that a fix would change if it applied: gradient clipping
(clipped after the all-reduce), a loss reported through a `Mean` in a custom
`train_step` (multiplied by the replicas), synchronized batch norm, sample weights in the
loss and metrics, an activity regularizer, and strategykit's
callbacks in every fit (`steps_per_execution` > 1 under a strategy fails in Keras
itself, with or without the fixes). Each runs with the fixes installed and again with them removed:
the weights, logs and callbacks must be the same, bit for bit. Keras's own test files run
with the fixes in use too (`strategykit_in_use`): their results must be those without.
"""


import os
import pathlib
import subprocess
import sys
from xml.etree import ElementTree

import keras
import numpy as np
import pytest
import tensorflow as tf

import strategykit as sk
from strategykit import upstream
from strategykit.made import strategies

from conftest import cpu_devices

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


def _train(strategy) -> dict:
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


def _in_use() -> None:
    """strategykit in use in the process: its strategy trained on its padded data."""
    strategy = sk.mirrored(replicas=2)
    x, y, _ = _data()
    with strategy.scope():
        model = keras.Sequential([keras.Input((3,)),
                                  keras.layers.BatchNormalization(synchronized=True),
                                  keras.layers.Dense(1)])
        model.compile(keras.optimizers.SGD(global_clipnorm=0.1), "mse")
    model.fit(sk.shard((x, y), strategy, global_batch_size=16), epochs=1, verbose=0)


@pytest.mark.parametrize("where", ["a MirroredStrategy of the user's", "one device"])
def test_other_models_train_as_without_strategykit(where):
    _in_use()
    strategy = (tf.distribute.MirroredStrategy(cpu_devices(2)) if where.startswith("a")
                else tf.distribute.get_strategy())
    with_fixes = _train(strategy)
    upstream.uninstall()
    try:
        without = _train(strategy)
    finally:
        upstream.install()
    for ours, keras_own in zip(with_fixes["weights"], without["weights"]):
        np.testing.assert_array_equal(ours, keras_own)
    assert with_fixes["logs"] == without["logs"]
    assert without["callbacks"] == []
    # strategykit's callbacks join no fit of these models; on one device only the position
    # tracker of sk.shard's data, once sk.shard sharded data for one device (it reads and
    # changes nothing of the model: the weights and logs above are Keras's own).
    one_device_data = strategies.sharded_for(strategy) and not strategies.is_ours(strategy)
    assert with_fixes["callbacks"] == (["EpochTracker"] if one_device_data else [])


_KERAS_TESTS = {  # Keras's own test files of the parts the fixes replace code of
    "backend/tensorflow/distribute_test.py": None,
    "backend/tensorflow/optimizer_distribute_test.py": None,
    "layers/normalization/batch_normalization_test.py": None,
    "optimizers/optimizer_test.py": None,
    "trainers/epoch_iterator_test.py": None,
    # the fit(), evaluate() and predict() tests the fixes' code paths run through (the
    # whole file takes minutes; jax, torch and grain are not installed)
    "trainers/trainer_test.py": "(distribut or steps_per_execution or class_weight or "
                                "sample_weight or metric) and not jit and not jax and not "
                                "torch and not grain and not unrolled",
    "callbacks/callback_test.py": None,
    "callbacks/early_stopping_test.py": None,
    "callbacks/model_checkpoint_test.py": None,
    "callbacks/backup_and_restore_test.py": None,
}


def _run_keras_tests(tmp_path, arguments: list[str], *, with_strategykit: bool) -> dict:
    """Runs Keras's tests (pytest `arguments`) in a fresh process; returns `{test:
    "passed" | "failed" | "skipped"}`."""
    report = tmp_path / "report.xml"
    report.unlink(missing_ok=True)
    plugin = ["-p", "strategykit_in_use"] if with_strategykit else []
    env = {**os.environ, "KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "2",
           "PYTHONPATH": os.pathsep.join([str(pathlib.Path(__file__).parent),
                                          os.environ.get("PYTHONPATH", "")])}
    subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *plugin, "-q",
                    f"--junitxml={report}", *arguments],
                   cwd=tmp_path, env=env, capture_output=True, timeout=600,
                   start_new_session=True)
    outcomes = {}
    for case in ElementTree.parse(report).getroot().iter("testcase"):
        tags = {child.tag for child in case}
        outcomes[f"{case.get('classname')}::{case.get('name')}"] = (
            "failed" if tags & {"failure", "error"} else
            "skipped" if "skipped" in tags else "passed")
    return outcomes


def test_keras_own_tests_pass_with_the_fixes_in_use_as_without(tmp_path):
    source = pathlib.Path(keras.__file__).parent / "src"
    groups = [[str(source / name) for name, chosen in _KERAS_TESTS.items() if chosen is None]]
    groups += [[str(source / name), "-k", chosen] for name, chosen in _KERAS_TESTS.items()
               if chosen is not None]
    passed = 0
    for arguments in groups:
        outcomes = _run_keras_tests(tmp_path, arguments, with_strategykit=True)
        passed += sum(outcome == "passed" for outcome in outcomes.values())
        failed = sorted(test for test, outcome in outcomes.items() if outcome == "failed")
        if failed:  # each must fail without strategykit too (a package not installed)
            without = _run_keras_tests(tmp_path, arguments, with_strategykit=False)
            assert {test: without.get(test) for test in failed} == dict.fromkeys(
                failed, "failed"), failed
    assert passed > 100  # the tests ran
