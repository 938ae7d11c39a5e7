"""Every public function refuses wrong arguments clearly: the argument, what was received,
the fix (issue 44). One row a case: the call, then three pieces of its message.

Keras 2 (tf_keras) is not installed here: its objects are stand-ins, classes defined in a
module named like tf_keras's, which is how strategykit recognises them (it never imports
tf_keras); `TF_USE_LEGACY_KERAS` is set with monkeypatch, and once for real in a fresh
interpreter, with a stand-in `tf_keras` package on its path.
"""

import os
import subprocess
import sys
import textwrap
import types
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import strategykit as sk
from strategykit.pinning import legacy_keras


def _keras_2(name: str, module: str) -> type:
    """A stand-in class of Keras 2, named `name` in tf_keras's `module`."""
    return types.new_class(name, exec_body=lambda ns: ns.update(__module__=module))


Keras2Sequential = _keras_2("Sequential", "tf_keras.src.engine.sequential")
Keras2Mean = _keras_2("Mean", "tf_keras.src.metrics.base_metric")


class MyKeras2Model(Keras2Sequential):  # a user's subclass, defined outside tf_keras
    pass


class Batches(keras.utils.PyDataset):
    """A user's PyDataset: batches of 4 examples."""

    def __len__(self):
        return 2

    def __getitem__(self, index):
        return np.zeros((4, 3), "float32"), np.zeros(4, "float32")


@pytest.fixture(scope="module")
def ctx():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    x = np.arange(96, dtype="float32").reshape(32, 3)
    return types.SimpleNamespace(strategy=sk.mirrored(replicas=2), model=model, x=x,
                                 y=x.sum(1), fn=lambda: model)


# (id, call of ctx, pieces of its message: the argument, what was received, the fix[, marks])
CASES = [
    # sk.mirrored, sk.from_env
    ("mirrored count as devices", lambda c: sk.mirrored(2),
     ("devices", "Received: devices=2 (an int)", "sk.mirrored(replicas=2)")),
    ("mirrored numpy count", lambda c: sk.mirrored(np.int64(4)),
     ("devices", "Received: devices=4 (an int64)", "sk.mirrored(replicas=4)")),
    ("mirrored one name", lambda c: sk.mirrored("/cpu:0"),
     ("devices", "Received: devices='/cpu:0'", "devices=['/gpu:0', '/gpu:1']")),
    ("mirrored ints", lambda c: sk.mirrored([0, 1]),
     ("devices", "Received: devices=[0, 1]", "replicas=N")),
    ("mirrored empty", lambda c: sk.mirrored([]),
     ("devices", "Received: devices=[]", "devices=['/gpu:0'")),
    ("mirrored bad name", lambda c: sk.mirrored(["gpu zero"]),
     ("devices", "Received: devices=['gpu zero']", "'/gpu:0'")),
    ("mirrored both", lambda c: sk.mirrored(["/cpu:0"], replicas=1),
     ("devices or replicas", "Received: devices=['/cpu:0'], replicas=1", "replicas=N")),
    ("mirrored float replicas", lambda c: sk.mirrored(replicas=2.0),
     ("replicas", "Received: replicas=2.0", "replicas=2")),
    ("mirrored zero replicas", lambda c: sk.mirrored(replicas=0),
     ("replicas", "Received: replicas=0", "replicas=2")),
    ("mirrored ops", lambda c: sk.mirrored(replicas=2, cross_device_ops="ring"),
     ("cross_device_ops", "Received: cross_device_ops='ring'", "'reduce_to_one_device'")),
    ("mirrored ops type", lambda c: sk.mirrored(replicas=2, cross_device_ops=5),
     ("cross_device_ops", "Received: cross_device_ops=5", "CrossDeviceOps instance")),
    ("from_env ops", lambda c: sk.from_env(cross_device_ops="ring"),
     ("cross_device_ops", "Received: cross_device_ops='ring'", "'auto'")),
    # sk.shard of inputs numpy cannot stack (issue 54)
    ("shard PyDataset", lambda c: sk.shard(Batches(), c.strategy, global_batch_size=4),
     ("keras.utils.PyDataset yields batches", "Received: a Batches",
      "tf.data.Dataset.from_generator")),
    ("shard generator", lambda c: sk.shard((x for x in c.x), c.strategy, global_batch_size=4),
     ("a generator or iterator can be read only once", "Received: a generator",
      "tf.data.Dataset.from_generator")),
    ("shard list of pairs", lambda c: sk.shard([(x, 1.0) for x in c.x], c.strategy,
                                              global_batch_size=4),
     ("not a list of examples", "Received: a list of 32 tuples", "np.stack")),
    ("shard ragged list", lambda c: sk.shard(([[1, 2], [3]], [0, 1]), c.strategy,
                                            global_batch_size=2),
     ("examples of data[0] differ: example 0 has shape (2,) and example 1 has shape (1,)",
      "Received: data[0], a list of examples of different shapes",
      "keras.utils.pad_sequences")),
    ("shard object array", lambda c: sk.shard(
        {"a": np.array([np.zeros(2), np.zeros(3)], dtype=object)}, c.strategy,
        global_batch_size=2),
     ("examples of data['a'] differ: example 0 has shape (2,) and example 1 has shape (3,)",
      "Received: data['a'], a ndarray of examples", "keras.utils.pad_sequences")),
    # sk.shard of inputs that failed deep or silently (issue 55)
    ("shard empty dict", lambda c: sk.shard({}, c.strategy, global_batch_size=4),
     ("data holds no arrays", "Received: data={}", "(x, y)")),
    ("shard empty tuple", lambda c: sk.shard((), c.strategy, global_batch_size=4),
     ("data holds no arrays", "Received: data=()", "(x, y)")),
    ("shard empty features", lambda c: sk.shard(({}, c.y), c.strategy, global_batch_size=4),
     ("data[0] holds no arrays", "Received: data[0]={}", "(x, y)")),
    ("shard batch beyond int32", lambda c: sk.shard(c.x, c.strategy, global_batch_size=2**31),
     ("global_batch_size must be a positive integer",
      "Received: global_batch_size=2147483648, above 2**31 - 1", "global_batch_size=64")),
    ("shard seed text", lambda c: sk.shard(c.x, c.strategy, global_batch_size=4,
                                           shuffle=True, seed="abc"),
     ("seed must be None or an integer", "Received: seed='abc'", "seed=42")),
    ("shard seed float", lambda c: sk.shard(c.x, c.strategy, global_batch_size=4, seed=1.5),
     ("seed must be None or an integer", "Received: seed=1.5", "seed=42")),
    ("shard seed bool", lambda c: sk.shard(c.x, c.strategy, global_batch_size=4, seed=True),
     ("seed must be None or an integer", "Received: seed=True", "seed=42")),
    ("shard seed negative", lambda c: sk.shard(c.x, c.strategy, global_batch_size=4,
                                               shuffle=True, seed=-1),
     ("from 0 to 2**32 - 1", "Received: seed=-1", "seed=42")),
    ("shard buffer 0", lambda c: sk.shard(c.x, c.strategy, global_batch_size=4, shuffle=True,
                                          shuffle_buffer=0),
     ("shuffle_buffer must be None", "Received: shuffle_buffer=0", "shuffle_buffer=10000")),
    ("shard buffer -1", lambda c: sk.shard(c.x, c.strategy, global_batch_size=4, shuffle=True,
                                           shuffle_buffer=-1),
     ("a positive number of examples", "Received: shuffle_buffer=-1", "shuffle_buffer=")),
    ("shard buffer float", lambda c: sk.shard(c.x, c.strategy, global_batch_size=4,
                                              shuffle=True, shuffle_buffer=2.5),
     ("a positive number of examples", "Received: shuffle_buffer=2.5", "shuffle_buffer=")),
    ("shard function without context", lambda c: sk.shard(
        lambda: tf.data.Dataset.range(8), c.strategy, global_batch_size=4),
     ("takes no such argument", "Received: <lambda>()", "def make_dataset(input_context)")),
    ("shard windows", lambda c: sk.shard(tf.data.Dataset.range(8).window(2), c.strategy,
                                         global_batch_size=4),
     ("elements that are datasets themselves (windows", "Received: element_spec=DatasetSpec",
      ".flat_map(lambda w: w.batch(n))")),
    ("shard function of windows", lambda c: sk.shard(
        lambda context: tf.data.Dataset.range(8).window(2), c.strategy, global_batch_size=4),
     ("fn(input_context) has elements that are datasets", "Received: element_spec=",
      ".window(n, drop_remainder=True)")),
    ("shard ragged dataset", lambda c: sk.shard(tf.data.Dataset.from_tensor_slices(
        tf.ragged.constant([[1, 2], [3]])), c.strategy, global_batch_size=2),
     ("ragged elements", "Received: element_spec=RaggedTensorSpec",
      "keras.utils.pad_sequences")),
    ("shard -0.0 weight", lambda c: sk.shard((c.x, c.y, np.where(c.y > 50, 1.0, -0.0)),
                                            c.strategy, global_batch_size=4),
     ("sample_weight holds -0.0", "Received: -0.0 at example 0 and", "sample_weight + 0.0")),
    # sk.describe, sk.reduce, sk.is_chief, sk.scale_learning_rate
    ("describe count", lambda c: sk.describe(2),
     ("strategy", "Received: strategy=2", "sk.mirrored(replicas=N)")),
    ("describe class", lambda c: sk.describe(tf.distribute.MirroredStrategy),
     ("strategy", "Received: strategy=<class", "None for the current strategy")),
    ("reduce strategy", lambda c: sk.reduce(tf.constant(1.0), None),
     ("strategy", "Received: strategy=None", "sk.mirrored(replicas=N)")),
    ("reduce op", lambda c: sk.reduce(tf.constant(1.0), c.strategy, "median"),
     ("reduction", "Received: op='median'", "'mean', 'sum', 'min', 'max', 'std'")),
    ("is_chief", lambda c: sk.is_chief("chief"),
     ("strategy", "Received: strategy='chief'", "sk.from_env()")),
    ("scale_learning_rate lr", lambda c: sk.scale_learning_rate("0.1", 64, base_batch_size=32),
     ("base_lr", "Received: base_lr='0.1'", "Pass the learning rate")),
    ("scale_learning_rate batch",
     lambda c: sk.scale_learning_rate(0.1, 64.0, base_batch_size=32),
     ("global_batch_size", "Received: global_batch_size=64.0", "e.g. 256")),
    ("scale_learning_rate rule",
     lambda c: sk.scale_learning_rate(0.1, 64, base_batch_size=32, rule="log"),
     ("rule", "Received: rule='log'", '"sqrt"')),
    # sk.shard, sk.per_replica_batch_size, sk.replica_batches, sk.epochs, sk.shard_tfds
    ("shard arguments swapped", lambda c: sk.shard(c.strategy, c.x, global_batch_size=4),
     ("strategy", "Received: strategy=a ndarray", "sk.mirrored(replicas=N)")),
    ("shard batch", lambda c: sk.shard(c.x, c.strategy, global_batch_size="4"),
     ("global_batch_size", "Received: global_batch_size='4'", "global_batch_size=64")),
    ("shard uneven batch", lambda c: sk.shard(c.x, c.strategy, global_batch_size=5),
     ("global_batch_size", "Received: global_batch_size=5", "multiple of 2")),
    ("shard data", lambda c: sk.shard("x.npy", c.strategy, global_batch_size=4),
     ("data", "Received: str", "numpy arrays")),
    ("shard unknown size", lambda c: sk.shard(
        tf.data.Dataset.from_tensor_slices(c.x).filter(lambda x: True), c.strategy,
        global_batch_size=4, shuffle=True),
     ("shuffle buffer", "Received: shuffle_buffer=None", "Pass shuffle_buffer=")),
    ("per_replica_batch_size", lambda c: sk.per_replica_batch_size(64, c.strategy),
     ("strategy", "Received: strategy=64", "sk.mirrored(replicas=N)")),
    ("shard model as data", lambda c: sk.shard(c.model, c.strategy, global_batch_size=4),
     ("data", "Received: data=a Sequential", "numpy arrays")),
    ("shard augment", lambda c: sk.shard(c.x, c.strategy, global_batch_size=4, augment=1),
     ("augment", "Received: augment=1", "(example, seed)")),
    ("replica_batches of arrays", lambda c: sk.replica_batches(c.x, c.strategy),
     ("ds", "Received: ds of type ndarray", "sk.shard")),
    ("epochs count", lambda c: list(sk.epochs(c.x, "2")),
     ("epochs", "Received: epochs='2'", "epochs=")),
    ("shard_tfds name", lambda c: sk.shard_tfds(1, "train", c.strategy, global_batch_size=4),
     ("name", "Received: name=1", "'mnist'")),
    ("shard_tfds seed", lambda c: sk.shard_tfds("mnist", "train", c.strategy,
                                                global_batch_size=4, seed="abc"),
     ("seed must be None or an integer", "Received: seed='abc'", "seed=42")),
    ("shard_tfds buffer 0", lambda c: sk.shard_tfds("mnist", "train", c.strategy,
                                                    global_batch_size=4, shuffle_buffer=0),
     ("shuffle_buffer must be None", "Received: shuffle_buffer=0", "shuffle_buffer=10000")),
    # sk.SyncBatchNormalization, sk.convert_sync_batchnorm
    ("SyncBatchNormalization", lambda c: sk.SyncBatchNormalization(synchronized=False),
     ("synchronized", "Received: synchronized=False", "keras.layers.BatchNormalization")),
    ("SyncBatchNormalization axes", lambda c: sk.SyncBatchNormalization(axis=[1, 2]),
     ("one channel axis", "Received: axis=[1, 2]", "keras.layers.Reshape")),
    ("SyncBatchNormalization rank 1", lambda c: sk.SyncBatchNormalization()(np.zeros(4)),
     ("inputs of rank 2 or more", "Received: input_shape=(4,)", "x[:, None]")),
    ("convert None", lambda c: sk.convert_sync_batchnorm(None),
     ("Keras model", "Received: model=None", "keras.Sequential or Functional")),
    ("convert layer", lambda c: sk.convert_sync_batchnorm(keras.layers.BatchNormalization()),
     ("Keras model", "Received: model=a BatchNormalization", "keras.Sequential")),
    ("convert flag", lambda c: sk.convert_sync_batchnorm(c.model, synchronized="yes"),
     ("synchronized", "Received: synchronized='yes'", "Pass True (default)")),
    ("convert Keras 2", lambda c: sk.convert_sync_batchnorm(Keras2Sequential()),
     ("model is a Keras 2 object", "Received: model=Sequential (Keras 2)", "import keras")),
    ("convert Keras 2 subclass", lambda c: sk.convert_sync_batchnorm(MyKeras2Model()),
     ("model is a Keras 2 object", "Received: model=MyKeras2Model (Keras 2)",
      "import keras")),
    # sk.check
    ("check model", lambda c: sk.check(c.model, (c.x, c.y)),
     ("model_fn must be a function", "Received: model_fn=a Sequential model",
      "sk.check(lambda: build_model(), data)")),
    ("check None", lambda c: sk.check(None, (c.x, c.y)),
     ("model_fn", "Received: model_fn=None", "lambda: build_model()")),
    ("check same model twice", lambda c: sk.check(c.fn, (c.x, c.y), steps=1, dtype=None),
     ("model_fn returned the same model", "Received: model_fn returning the model",
      "return a new model inside model_fn")),
    ("check returns no model", lambda c: sk.check(lambda: 3, (c.x, c.y), steps=1),
     ("model_fn must return a compiled Keras model", "Received: model_fn() returned an int",
      "model.compile(optimizer, loss)")),
    ("check Keras 2 model_fn", lambda c: sk.check(Keras2Sequential(), (c.x, c.y)),
     ("model_fn is a Keras 2 object", "Received: model_fn=Sequential (Keras 2)",
      "import keras")),
    ("check returns Keras 2", lambda c: sk.check(lambda: Keras2Sequential(), (c.x, c.y),
                                                  steps=1),
     ("model_fn() is a Keras 2 object", "Received: model_fn()=Sequential (Keras 2)",
      "import keras")),
    ("check replicas", lambda c: sk.check(c.fn, (c.x, c.y), replicas="2"),
     ("replicas", "Received: replicas='2'", "replicas=2")),
    ("check steps", lambda c: sk.check(c.fn, (c.x, c.y), steps=0),
     ("steps", "Received: steps=0", "steps=3")),
    ("check batch", lambda c: sk.check(c.fn, (c.x, c.y), global_batch_size="8"),
     ("global_batch_size", "Received: global_batch_size='8'", "global_batch_size=8")),
    ("check uneven batch", lambda c: sk.check(c.fn, (c.x, c.y), global_batch_size=5),
     ("global_batch_size", "Received: global_batch_size=5", "multiple of 2")),
    ("check tolerance", lambda c: sk.check(c.fn, (c.x, c.y), tolerance=-1),
     ("tolerance", "Received: tolerance=-1", "tolerance=1e-5")),
    ("check strategy", lambda c: sk.check(c.fn, (c.x, c.y), strategy=2),
     ("strategy", "Received: strategy=2", "sk.mirrored(replicas=N)")),
    ("check dtype", lambda c: sk.check(c.fn, (c.x, c.y), dtype="float16"),
     ("dtype", "Received: dtype='float16'", '"float64"')),
    ("check accumulation", lambda c: sk.check(c.fn, (c.x, c.y),
                                              gradient_accumulation_steps=0),
     ("gradient_accumulation_steps", "Received: gradient_accumulation_steps=0", "e.g. 4")),
    ("check data", lambda c: sk.check(c.fn, 3),
     ("data must be", "Received: int", "Pass numpy arrays")),
    ("check too little data", lambda c: sk.check(c.fn, (c.x[:4], c.y[:4])),
     ("The data holds 4 examples", "Received: steps=3", "Pass more data")),
    # sk.combine_across_replicas
    ("combine metric", lambda c: sk.combine_across_replicas(2, total="max"),
     ("keras.metrics.Metric", "Received: metric=2", "Pass the metric")),
    ("combine nothing", lambda c: sk.combine_across_replicas(keras.metrics.Mean),
     ("at least one variable", "Received: no keyword", 'maximum="max"')),
    ("combine how", lambda c: sk.combine_across_replicas(keras.metrics.Mean, total="median"),
     ("variable 'total'", "Received: total='median'", '"sum", "max", "min"')),
    ("combine Keras 2", lambda c: sk.combine_across_replicas(Keras2Mean, total="max"),
     ("metric is a Keras 2 object", "Received: metric=Mean (Keras 2)", "import keras")),
    # sk.callbacks
    ("CrossReplicaLoss reductions", lambda c: sk.callbacks.CrossReplicaLoss(5),
     ("reductions", "Received: reductions=5", "reductions=('mean', 'max')")),
    ("CrossReplicaLoss one reduction", lambda c: sk.callbacks.CrossReplicaLoss("max"),
     ("reductions", "Received: reductions='max'", "reductions=('mean', 'max')")),
    ("CrossReplicaLoss flag", lambda c: sk.callbacks.CrossReplicaLoss(per_replica="no"),
     ("per_replica", "Received: per_replica='no'", "per_replica=False")),
    ("CrossReplicaLoss on_nan", lambda c: sk.callbacks.CrossReplicaLoss(on_nan="skip"),
     ("on_nan", "Received: on_nan='skip'", "raise")),
    ("CrossReplicaLoss progress", lambda c: sk.callbacks.CrossReplicaLoss(progress="most"),
     ("progress", "Received: progress='most'", "progress='spread'")),
    ("CrossReplicaLoss Keras 2 fit",
     lambda c: sk.callbacks.CrossReplicaLoss().set_model(Keras2Sequential()),
     ("model is a Keras 2 object", "Received: model=Sequential (Keras 2)", "import keras")),
    ("LossPlot path", lambda c: sk.callbacks.LossPlot(path=5),
     ("path", "Received: path=5", "path='loss.png'")),
    ("LossPlot show", lambda c: sk.callbacks.LossPlot(show="yes"),
     ("show", "Received: show='yes'", "show='auto'")),
    ("BackupAndRestore dir", lambda c: sk.callbacks.BackupAndRestore(5),
     ("backup_dir", "Received: backup_dir=5", "backup_dir='/tmp/backup'")),
    ("BackupAndRestore Keras 2 fit",
     lambda c: sk.callbacks.BackupAndRestore("/tmp/b").set_model(Keras2Sequential()),
     ("model is a Keras 2 object", "Received: model=Sequential (Keras 2)", "import keras")),
]


def _param(name, call, pieces, marks=()):
    return pytest.param(call, pieces, id=name, marks=marks)


@pytest.mark.parametrize(("call", "pieces"), [_param(*case) for case in CASES])
def test_each_message_names_the_argument_what_was_received_and_the_fix(
        ctx, monkeypatch, call, pieces):
    monkeypatch.delenv(legacy_keras.VARIABLE, raising=False)
    argument, received, fix = pieces
    with pytest.raises(ValueError, match="Received: ") as raised:
        call(ctx)
    message = str(raised.value)
    for piece in pieces:
        assert piece in message, f"{piece!r} not in: {message}"
    assert message.index(argument) < message.index(received), message
    assert fix in message[message.index("Received: "):], message  # the fix comes after


def test_mirrored_takes_logical_devices_and_numpy_counts():
    devices = tf.config.list_logical_devices("CPU")[:2]
    assert sk.mirrored(devices).num_replicas_in_sync == 2
    assert sk.mirrored(replicas=np.int64(2)).num_replicas_in_sync == 2


def test_keras_2_refusal_names_the_variable_when_it_is_set(monkeypatch):
    monkeypatch.setenv(legacy_keras.VARIABLE, "1")
    with pytest.raises(ValueError, match=r"model is a Keras 2 object .*Received: model="
                       r"Sequential \(Keras 2\)\. TF_USE_LEGACY_KERAS=1 is set, so tf\.keras "
                       r"is Keras 2\. Unset it \(or set TF_USE_LEGACY_KERAS=0\)"):
        sk.convert_sync_batchnorm(Keras2Sequential())
    keras_3 = keras.Sequential([keras.Input((2,)), keras.layers.BatchNormalization()])
    assert sk.convert_sync_batchnorm(keras_3) is keras_3  # Keras 3 works as always


@pytest.fixture
def stand_in_tf_keras(tmp_path):
    """A directory holding an empty package named tf_keras (findable, never imported)."""
    (tmp_path / "tf_keras").mkdir()
    (tmp_path / "tf_keras" / "__init__.py").write_text("")
    return tmp_path


def test_the_variable_warns_once_at_the_first_strategy_when_tf_keras_is_installed(
        monkeypatch, stand_in_tf_keras):
    monkeypatch.setattr(legacy_keras, "_warned", False)
    monkeypatch.setenv(legacy_keras.VARIABLE, "True")
    with warnings.catch_warnings(record=True) as unfound:
        warnings.simplefilter("always")
        sk.mirrored(replicas=2)  # tf_keras not found: no warning (Ray sets the variable)
    assert not [w for w in unfound if "Keras 3 only" in str(w.message)]
    monkeypatch.setattr(legacy_keras, "_warned", False)
    monkeypatch.syspath_prepend(str(stand_in_tf_keras))
    with pytest.warns(UserWarning, match=r"Keras 3 only.*TF_USE_LEGACY_KERAS=True is set, "
                      r"so tf\.keras is Keras 2\. Unset it") as warned:
        sk.mirrored(replicas=2)
        sk.mirrored(replicas=2)
    [said] = [w for w in warned if "Keras 3 only" in str(w.message)]
    assert said.filename == __file__  # points at the user's call


def test_a_fresh_interpreter_with_the_variable_set(stand_in_tf_keras):
    script = textwrap.dedent("""
        import warnings
        import keras
        import strategykit as sk  # imports as always
        warnings.simplefilter("always")
        with warnings.catch_warnings(record=True) as caught:
            sk.mirrored()
            sk.mirrored()
        said = [str(w.message) for w in caught if "Keras 3 only" in str(w.message)]
        assert len(said) == 1 and "TF_USE_LEGACY_KERAS=1 is set" in said[0], said
        model = keras.Sequential([keras.Input((2,)), keras.layers.BatchNormalization()])
        assert sk.convert_sync_batchnorm(model) is model
        print("ok")
    """)
    path = os.pathsep.join(filter(None, [str(stand_in_tf_keras), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, legacy_keras.VARIABLE: "1", "PYTHONPATH": path,
           "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


def test_a_callback_class_is_named_for_strategykit_models_only(ctx):
    with ctx.strategy.scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        model.compile("sgd", "mse")
    data = sk.shard((ctx.x, ctx.y), ctx.strategy, global_batch_size=4)
    with pytest.raises(TypeError, match=r"callbacks must be callback instances, and this is "
                       r"a class\. Received: callbacks=\[\.\.\., CrossReplicaLoss, \.\.\.\]\. "
                       r"Pass CrossReplicaLoss\(\)"):
        model.fit(data, callbacks=[sk.callbacks.CrossReplicaLoss], verbose=0, shuffle=False)
    with pytest.raises(TypeError, match=r"Pass TerminateOnNaN\(\)"):
        model.evaluate(data, callbacks=[keras.callbacks.TerminateOnNaN], verbose=0)
    # A model of no strategykit strategy gets Keras's own error, as without strategykit
    with pytest.raises(TypeError, match="set_model"):
        ctx.model.fit(ctx.x, ctx.y, callbacks=[keras.callbacks.TerminateOnNaN], verbose=0)


def test_keras_own_backup_and_restore_is_refused_across_workers_only(ctx, tmp_path,
                                                                     monkeypatch):
    with ctx.strategy.scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        model.compile("sgd", "mse")
    data = sk.shard((ctx.x, ctx.y), ctx.strategy, global_batch_size=4)
    keras_backup = keras.callbacks.BackupAndRestore(str(tmp_path / "b"))
    model.fit(data, callbacks=[keras_backup], verbose=0, shuffle=False)  # one process: Keras's
    from strategykit.upstream import every_fit  # across workers (tests/cluster: for real)
    monkeypatch.setattr(every_fit, "is_multi_worker", lambda strategy: True)
    with pytest.raises(ValueError, match=(
            r"keras\.callbacks\.BackupAndRestore writes its backup in place from every worker"
            r": .* Received: callbacks=\[\.\.\., BackupAndRestore\(backup_dir='.*/b'\), "
            r"\.\.\.\] across several workers\. Use sk\.callbacks\.BackupAndRestore\('.*/b'\) "
            r"\(Keras's arguments\)")):
        model.fit(data, callbacks=[keras_backup], verbose=0, shuffle=False)
    model.fit(data, callbacks=[sk.callbacks.BackupAndRestore(tmp_path / "sk")], verbose=0,
              shuffle=False)


def test_a_batch_far_above_the_data_is_warned_of_not_refused(ctx):
    with pytest.warns(UserWarning, match=r"global_batch_size=1048576 is more than twice the "
                      r"data: the one step of all 9 examples is padded with 1048567 copies "
                      r".*Pass global_batch_size=10 to skip them"):
        sk.shard(ctx.x[:9], ctx.strategy, global_batch_size=2**20)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a batch above the data, as Keras takes one
        sk.shard(ctx.x[:9], ctx.strategy, global_batch_size=16)
        sk.shard(ctx.x[:9], ctx.strategy, global_batch_size=64, pad_remainder=False)
