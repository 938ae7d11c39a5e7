"""model.predict(sk.shard(...)): each example once, in the data's order, as one device.

One device runs Keras as it is, `model.predict(x, batch_size=global_batch_size)` on numpy
arrays; the replicas predict `sk.shard` data, whose final partial batch is padded with
copies (202 = 3 x 64 + 10 examples: on 4 replicas 3, 3, 2 and 2 real ones, each replica
filled up to 16 with copies). Each example gives its own prediction, so a copy left in
or a row out of order shows.
"""

import dataclasses

import keras
import numpy as np
import pytest
import tensorflow as tf
import test_tfds_input

import strategykit as sk
from strategykit import upstream
from strategykit.data import predict_input
from strategykit.data.tfds_input import prepared_builder, tfds_examples
from strategykit.upstream import exact_predictions

from conftest import cpu_devices
from workers import run_workers

data_dir = test_tfds_input.data_dir  # a fixture: the toy TFDS dataset of 22 examples
SIZE, GLOBAL_BATCH = 202, 64
X = np.random.default_rng(0).normal(size=(SIZE, 3)).astype("float32")
Y = X.sum(axis=1, keepdims=True)
W = np.linspace(0.5, 2.0, SIZE).astype("float32")


def regressor():
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(8, activation="tanh"),
                             keras.layers.Dense(2)])


def two_in_two_out(outputs: str):
    """Inputs {"a": (3,), "b": (2,)}; two outputs, as a list or a dict."""
    keras.utils.set_random_seed(1)
    a, b = keras.Input((3,), name="a"), keras.Input((2,), name="b")
    hidden = keras.layers.Dense(4, activation="tanh")(keras.layers.Concatenate()([a, b]))
    p, q = keras.layers.Dense(1, name="p")(hidden), keras.layers.Dense(3, name="q")(hidden)
    return keras.Model({"a": a, "b": b}, [p, q] if outputs == "list" else {"p": p, "q": q})


def in_scope(strategy, build, *args):
    with strategy.scope():
        return build(*args)


def assert_same(got, expected):
    tf.nest.assert_same_structure(got, expected)
    for g, e in zip(tf.nest.flatten(got), tf.nest.flatten(expected), strict=True):
        assert g.shape == e.shape
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def expected():
    """One device's predictions of X, in batches of the global batch size."""
    return regressor().predict(X, batch_size=GLOBAL_BATCH, verbose=0)


@pytest.fixture(scope="module")
def four():
    """A strategy of 4 replicas and a regressor built in its scope, for the module."""
    strategy = sk.mirrored(cpu_devices(4))
    return strategy, in_scope(strategy, regressor)


@pytest.mark.parametrize("pad_remainder", [True, False], ids=["padded", "split"])
def test_predict_gives_each_example_once_in_order(four, expected, pad_remainder):
    strategy, model = four
    ds = sk.shard(X, strategy, global_batch_size=GLOBAL_BATCH, pad_remainder=pad_remainder)
    assert_same(model.predict(ds, verbose=0), expected)  # padded: 256 rows without the fix
    assert_same(model.predict(ds, verbose=0), expected)  # again, from the same dataset


def test_a_remainder_smaller_than_the_replicas(four, expected):
    # 194 = 3 x 64 + 2: padded, replicas 2 and 3 hold copies only; split, the last batch
    # holds 66 examples (16 or 17 a replica).
    strategy, model = four
    for pad_remainder in (True, False):
        ds = sk.shard(X[:194], strategy, global_batch_size=GLOBAL_BATCH,
                      pad_remainder=pad_remainder)
        assert_same(model.predict(ds, verbose=0), expected[:194])


@pytest.mark.parametrize("strategy", ["1 replica", "no strategy"])
def test_one_device(make_strategy, expected, strategy):
    strategy = make_strategy(1) if strategy == "1 replica" else tf.distribute.get_strategy()
    model = in_scope(strategy, regressor)
    ds = sk.shard((X, Y), strategy, global_batch_size=GLOBAL_BATCH, shuffle=True, seed=0)
    assert_same(model.predict(ds, verbose=0), expected)


def test_labeled_data(four, expected):
    strategy, model = four
    ds = sk.shard((X, Y), strategy, global_batch_size=GLOBAL_BATCH)
    assert_same(model.predict(ds, verbose=0), expected)


def test_weighted_data_in_executions_of_several_steps(make_strategy, expected):
    strategy = make_strategy(4)
    model = in_scope(strategy, regressor)
    model.compile("sgd", "mse", steps_per_execution=3)  # 4 steps: 3, then 1
    ds = sk.shard((X, Y, W), strategy, global_batch_size=GLOBAL_BATCH)
    assert_same(model.predict(ds, verbose=0), expected)


@pytest.mark.parametrize("outputs", ["list", "dict"])
def test_dict_inputs_and_several_outputs(make_strategy, outputs):
    x = {"a": X, "b": X[:, :2] * 3}
    one_device = two_in_two_out(outputs).predict(x, batch_size=GLOBAL_BATCH, verbose=0)
    strategy = make_strategy(4)
    model = in_scope(strategy, two_in_two_out, outputs)
    got = model.predict(sk.shard((x, Y), strategy, global_batch_size=GLOBAL_BATCH), verbose=0)
    assert_same(got, one_device)


@pytest.mark.parametrize("source", ["tf.data", "tf.data of unknown size", "fn"])
def test_tf_data_and_function_sources(four, expected, source):
    strategy, model = four
    examples = tf.data.Dataset.from_tensor_slices(X)
    data = {"tf.data": examples,
            "tf.data of unknown size": examples.filter(lambda x: True),
            "fn": lambda context: examples}[source]
    got = model.predict(sk.shard(data, strategy, global_batch_size=GLOBAL_BATCH), verbose=0)
    assert_same(got, expected)


def test_shuffled_data_comes_back_in_the_data_order(four, expected):
    # The batches are the shuffled pass's (augmented too); the rows, the data's order.
    def halved(x, seed):
        return x * 0.5

    strategy, model = four
    for seed in (3, None):
        ds = sk.shard(X * 2, strategy, global_batch_size=GLOBAL_BATCH, shuffle=True,
                      seed=seed, augment=halved)
        assert_same(model.predict(ds, verbose=0), expected)


def ids_model():
    keras.utils.set_random_seed(2)
    ids = keras.Input((), dtype="int64")
    as_float = keras.ops.expand_dims(keras.ops.cast(ids, "float32"), -1)
    return keras.Model(ids, keras.layers.Dense(2)(as_float))


@pytest.mark.parametrize("pad_remainder", [True, False], ids=["padded", "split"])
def test_tfds_split_in_its_order(make_strategy, data_dir, pad_remainder):
    # 22 = 2 x 8 + 6 examples: 2, 2, 1 and 1 real ones in the final step of 4 replicas.
    order = [int(i) for i, _ in tfds_examples(prepared_builder("sharding_toy", data_dir),
                                              "train")]  # TFDS's own reading order
    assert sorted(order) == list(range(test_tfds_input.EXAMPLES))
    expected = ids_model().predict(np.array(order), batch_size=8, verbose=0)
    strategy = make_strategy(4)
    model = in_scope(strategy, ids_model)
    ds = sk.shard_tfds("sharding_toy", "train", strategy, global_batch_size=8,
                       data_dir=data_dir, pad_remainder=pad_remainder)
    assert_same(model.predict(ds, verbose=0), expected)


def test_refusals(four, expected, data_dir):
    strategy, model = four
    subset = r"random subset of the examples.*Received: shuffle=True and {}.*shuffle=False"
    dropped = sk.shard(X, strategy, global_batch_size=GLOBAL_BATCH, shuffle=True, seed=0,
                       drop_remainder=True)
    with pytest.raises(ValueError, match=subset.format("drop_remainder=True")):
        model.predict(dropped)
    shuffled = sk.shard(X, strategy, global_batch_size=GLOBAL_BATCH, shuffle=True, seed=0)
    with pytest.raises(ValueError, match=subset.format(
            r"predict\(steps=2\) of a pass of 4 steps")):
        model.predict(shuffled, steps=2)
    with pytest.raises(ValueError, match=r"sk.shard_tfds\('sharding_toy', 'train', \.\.\.\) "
                                         r"in the split's order: TFDS reads its files in a "
                                         r"new order.*shuffle=True.*with shuffle=False"):
        in_scope(strategy, ids_model).predict(sk.shard_tfds(
            "sharding_toy", "train", strategy, global_batch_size=8, data_dir=data_dir,
            shuffle=True, seed=0))
    # unshuffled, part of the data is its first examples, as one device's steps
    unshuffled = sk.shard(X, strategy, global_batch_size=GLOBAL_BATCH, drop_remainder=True)
    assert_same(model.predict(unshuffled, steps=2, verbose=0), expected[:128])


def test_rows_are_put_in_order_or_refused():
    outputs = {"p": np.array([[10], [12], [11], [11]]), "q": np.array([0, 2, 1, 1])}
    got = predict_input.in_data_order(outputs, np.array([0, 2, 1, -1]))
    assert got["p"].tolist() == [[10], [11], [12]] and got["q"].tolist() == [0, 1, 2]
    with pytest.raises(ValueError, match=r"predicted 2 examples that are not the data's "
                                         r"first 2.*Received: predictions of the examples "
                                         r"at \[0, 3\]"):
        predict_input.in_data_order(np.zeros(3), np.array([3, -1, 0]))
    with pytest.raises(ValueError, match=r"one output row per example.*Received: an output "
                                         r"of 2 rows for 3 examples"):
        predict_input.in_data_order(np.zeros(2), np.array([0, 1, 2]))


def test_other_data_is_keras_own(four):
    strategy, model = four
    assert exact_predictions.predictor_of(X) is None
    assert model.predict(X[:10], batch_size=8, verbose=0).shape == (10, 2)


def test_on_unknown_keras_code_predict_of_sk_shard_data_refuses(four, expected):
    strategy, model = four
    fix = exact_predictions.FIXES[0]
    unknown = dataclasses.replace(fix, relies_on={
        f"{fix.owner}.predict": "0000000000000000"})
    fix.uninstall()
    try:
        assert unknown.install() is False and unknown.state() == "refusing"
        assert_same(model.predict(X, batch_size=GLOBAL_BATCH, verbose=0), expected)  # Keras's
        with pytest.raises(upstream.UnknownUpstreamCode, match=(
                r"cannot make predict\(\) of sk.shard data \(one row per example, in "
                r"order\) work on .*TensorFlowTrainer.predict")):
            model.predict(sk.shard(X, strategy, global_batch_size=GLOBAL_BATCH))
    finally:
        unknown.uninstall()
        fix.install()


_ACROSS_WORKERS = """
import json, sys
import keras, numpy as np, pytest, tensorflow as tf
import strategykit as sk

def regressor():
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, activation="tanh")])

x = np.random.default_rng(0).normal(size=(21, 3)).astype("float32")
strategy = sk.from_env()
expected = regressor().predict(x, batch_size=4, verbose=0)
with strategy.scope():
    model = regressor()
got = model.predict(sk.shard(x, strategy, global_batch_size=4), verbose=0)
with pytest.raises(ValueError, match=(
        r"predictions of sk.shard\\(fn\\(input_context\\)\\) in order across several "
        r"workers.*Received: .* under 2 workers. Pass arrays or an unbatched tf.data")):
    model.predict(sk.shard(lambda context: tf.data.Dataset.from_tensor_slices(x), strategy,
                           global_batch_size=4))
with pytest.raises(ValueError, match=(
        r"Received: sk.shard_tfds\\('sharding_toy', 'train', ...\\) under 2 workers. "
        r"For predict\\(\\), pass the split's examples to sk.shard")):
    model.predict(sk.shard_tfds("sharding_toy", "train", strategy, global_batch_size=4,
                                data_dir=sys.argv[1]))
print(json.dumps({"shape": list(got.shape), "error": float(np.abs(got - expected).max())}))
"""


def test_across_two_workers(data_dir, tmp_path):
    # 21 = 5 x 4 + 1 examples over 2 workers of 1 replica: the final step is 1 real
    # example and a copy. Data each worker reads its own part of is refused.
    for worker in run_workers(_ACROSS_WORKERS, 2, args=[data_dir], tmp_path=tmp_path):
        report = worker.last_json()
        assert report["shape"] == [21, 2]
        assert report["error"] < 1e-5
