"""A pytest plugin: the tests it runs see every strategykit fix installed and in use.

Loaded into a run of Keras's own test files (`-p strategykit_in_use`, by
`test_keras_own_tests.py`). Before any test it trains a model as strategykit's users do:
`sk.mirrored(replicas=2)`, synchronized batch norm, `sk.shard` data padded at its end,
so that every fix is installed, strategykit's callbacks are added to every fit of its
models and its registries hold a strategy and datasets. Keras's tests then build their
own models and strategies (`tf.distribute.MirroredStrategy`), which must run as if
strategykit were not imported. A stand-in `jax` module lets `trainer_test.py` import
(its jax tests are skipped on the TensorFlow backend).
"""

import sys
import types


def pytest_configure(config):
    import keras  # first: Keras asks whether jax is installed when it is imported
    import numpy as np
    import tensorflow as tf

    import strategykit as sk

    tf.config.set_logical_device_configuration(
        tf.config.list_physical_devices("CPU")[0],
        [tf.config.LogicalDeviceConfiguration()] * 2)
    strategy = sk.mirrored(replicas=2)
    with strategy.scope():
        model = keras.Sequential([keras.Input((3,)),
                                  keras.layers.BatchNormalization(synchronized=True),
                                  keras.layers.Dense(1)])
        model.compile(keras.optimizers.Adam(global_clipnorm=1.0), "mse", metrics=["mae"])
    x = np.random.default_rng(0).normal(size=(10, 3))
    model.fit(sk.shard((x, x[:, :1]), strategy, global_batch_size=4, shuffle=True, seed=1),
              epochs=2, verbose=0)
    states = {fix.state() for fix in sk.upstream.FIXES}
    assert states <= {"installed", "not needed", "on import", "no package"}, states
    config._strategykit_model = model  # kept alive: its strategy stays registered
    if "jax" not in sys.modules:
        stand_in = types.ModuleType("jax")
        stand_in.__path__ = []
        sys.modules["jax"] = stand_in
