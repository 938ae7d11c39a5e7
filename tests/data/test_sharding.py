"""sk.shard: hand-written expected shards, every example once, fit() equals one device."""

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import strategykit as sk
from strategykit.data import position
from strategykit.data.batching import spread_indices
from strategykit.data.pipeline import make_pipeline

from conftest import bn_regressor, cpu_devices, progress_lines

IDS = np.arange(10)

# range(10), global batch 4 (per-replica batch 4 / replicas), unshuffled: per step, per
# replica, the real example ids. The final step holds 2 examples.
EXPECTED = {
    (1, "pad"): [[[0, 1, 2, 3]], [[4, 5, 6, 7]], [[8, 9]]],
    (2, "pad"): [[[0, 1], [2, 3]], [[4, 5], [6, 7]], [[8], [9]]],
    (4, "pad"): [[[0], [1], [2], [3]], [[4], [5], [6], [7]], [[8], [9], [], []]],
    (1, "drop"): [[[0, 1, 2, 3]], [[4, 5, 6, 7]]],
    (2, "drop"): [[[0, 1], [2, 3]], [[4, 5], [6, 7]]],
    (4, "drop"): [[[0], [1], [2], [3]], [[4], [5], [6], [7]]],
}
# With padding, every replica's batch is full: the padded slots hold copies (weight 0).
# One replica pads nothing: its final batch is the remainder, as Keras batches numpy data.
EXPECTED_PADDED_FINAL = {1: [[8, 9]], 2: [[8, 8], [9, 9]], 4: [[8], [9], [8], [9]]}


def _sources():
    """The same ten labelled examples as numpy, tf.data and fn(input_context)."""
    return {
        "numpy": (IDS, IDS * 10),
        "tf.data": tf.data.Dataset.from_tensor_slices((IDS, IDS * 10)),
        "fn": lambda context: tf.data.Dataset.from_tensor_slices((IDS, IDS * 10)),
    }


@pytest.mark.parametrize("source", ["numpy", "tf.data", "fn"])
@pytest.mark.parametrize("replicas", [1, 2, 4])
@pytest.mark.parametrize("remainder", ["pad", "drop"])
def test_hand_written_shards(make_strategy, source, replicas, remainder):
    strategy = make_strategy(replicas)
    ds = sk.shard(_sources()[source], strategy, global_batch_size=4,
                  drop_remainder=remainder == "drop")
    assert sk.replica_batches(ds, strategy) == EXPECTED[replicas, remainder]
    if remainder == "pad":
        final = sk.replica_batches(ds, strategy, padding=True)[-1]
        assert final == EXPECTED_PADDED_FINAL[replicas]


@pytest.mark.parametrize("replicas", [1, 2, 4])
def test_labels_and_weights_travel_with_their_examples(make_strategy, replicas):
    strategy = make_strategy(replicas)
    for x, y, w in sk.shard((IDS, IDS * 10), strategy, global_batch_size=4):
        xs = strategy.experimental_local_results(x)
        ys = strategy.experimental_local_results(y)
        ws = strategy.experimental_local_results(w)
        for xr, yr, wr in zip(xs, ys, ws):
            np.testing.assert_array_equal(yr.numpy(), xr.numpy() * 10)
            final = int(xr.numpy()[0]) >= 8
            # never an empty replica batch; one replica's final batch is its 2 examples
            assert len(xr) == (2 if final and replicas == 1 else 4 // replicas)
            real = wr.numpy() > 0
            # full batches weigh 1; the final one's 2 real examples weigh 4 / 2 where
            # padded, 1 on one replica (nothing padded: a batch of 2 as one device's)
            expected = 2.0 if final and replicas > 1 else 1.0
            np.testing.assert_array_equal(wr.numpy()[real], expected)


# Shuffling comes before batching, and nothing in it depends on the replicas or the
# remainder: each source on 1 and on several replicas, and one case dropping the remainder
# on 4 (the batches each replica gets, for every source, replicas and remainder, are
# test_hand_written_shards').
@pytest.mark.parametrize(("source", "replicas", "drop"), [
    *[(source, replicas, False) for source in ("numpy", "tf.data", "fn") for replicas in (1, 2)],
    ("numpy", 4, True),
])
def test_shuffled_every_example_once(make_strategy, source, replicas, drop):
    strategy = make_strategy(replicas)
    kwargs = {"shuffle_buffer": 10} if source == "fn" else {}
    ds = sk.shard(_sources()[source], strategy, global_batch_size=4, shuffle=True, seed=3,
                  drop_remainder=drop, **kwargs)
    epochs = []
    for epoch in range(2):  # fit sets the epoch as each begins
        position.set_epoch(epoch)
        epochs.append(sk.replica_batches(ds, strategy))
    for steps in epochs:
        seen = [i for step in steps for replica in step for i in replica]
        assert len(seen) == len(set(seen))  # no duplicates
        assert len(seen) == (8 if drop else 10)  # nothing lost but the dropped remainder
        if not drop:
            assert sorted(seen) == list(range(10))
        for step in steps:
            assert all(replica for replica in step[: min(replicas, 2)])
    assert epochs[0] != epochs[1]  # reshuffled each epoch
    assert sk.replica_batches(ds, strategy) == epochs[1]  # one order an epoch
    again = sk.shard(_sources()[source], strategy, global_batch_size=4, shuffle=True,
                     seed=3, drop_remainder=drop, **kwargs)
    position.set_epoch(0)
    assert sk.replica_batches(again, strategy) == epochs[0]  # reproducible from the seed


def test_the_training_position_is_the_hosts_even_when_sharded_inside_a_scope(
        make_strategy, monkeypatch):
    monkeypatch.setattr(position, "_VARIABLES", {})  # made afresh by this test's shard
    strategy = make_strategy(2)
    with strategy.scope():
        ds = sk.shard((np.arange(8), np.arange(8)), strategy, global_batch_size=4,
                      shuffle=True, seed=1)
    assert not isinstance(position._VARIABLES["epoch"], tf.distribute.DistributedValues)
    position.set_epoch(3)
    assert len(sk.replica_batches(ds, strategy)) == 2


@pytest.mark.parametrize("source", ["numpy", "fn"])
def test_a_resumed_pass_starts_after_the_steps_done_and_the_next_pass_whole(
        make_strategy, source):
    strategy = make_strategy(2)
    kwargs = {"shuffle_buffer": 10} if source == "fn" else {}
    ds = sk.shard(_sources()[source], strategy, global_batch_size=4, shuffle=True, seed=3,
                  **kwargs)
    position.set_epoch(1)
    whole = sk.replica_batches(ds, strategy)
    assert int(ds.cardinality) == len(whole) == 3
    position.skip_steps(2)
    assert sk.replica_batches(ds, strategy) == whole[2:]
    assert sk.replica_batches(ds, strategy) == whole


def test_padded_batches_never_leave_a_replica_empty(make_strategy):
    strategy = make_strategy(4)
    ds = sk.shard((np.arange(9), np.arange(9)), strategy, global_batch_size=8)
    final = sk.replica_batches(ds, strategy, padding=True)[-1]
    assert [len(batch) for batch in final] == [2, 2, 2, 2]
    assert sk.replica_batches(ds, strategy)[-1] == [[8], [], [], []]


def test_split_remainder_spreads_the_final_batch_over_every_replica(make_strategy):
    strategy = make_strategy(4)

    def split(data, batch):
        return sk.replica_batches(
            sk.shard(data, strategy, global_batch_size=batch, pad_remainder=False), strategy,
            padding=True)

    ids = np.arange(18)
    # A final batch of 2 < 4 replicas joins the batch before it: 10 examples, none empty.
    assert split((IDS, IDS), 8) == [[[0, 1, 2], [3, 4, 5], [6, 7], [8, 9]]]
    assert split((ids, ids), 8) == [[[0, 1], [2, 3], [4, 5], [6, 7]],
                                     [[8, 9, 10], [11, 12, 13], [14, 15], [16, 17]]]
    assert split((ids[:14], ids[:14]), 8) == [[[0, 1], [2, 3], [4, 5], [6, 7]],
                                               [[8, 9], [10, 11], [12], [13]]]
    # Data of unknown size cannot look ahead: its tiny final batch is split as it is.
    unknown = tf.data.Dataset.from_tensor_slices((ids, ids)).filter(lambda x, y: True)
    assert split(unknown, 8)[-1] == [[16], [17], [], []]


def test_spread_indices_layout():
    indices, real = spread_indices(tf.constant(5), 8, 4)
    assert indices.numpy().tolist() == [0, 1, 2, 2, 3, 3, 4, 4]
    assert real.numpy().tolist() == [True, True, True, False, True, False, True, False]


def test_dict_of_arrays_and_user_sample_weights(make_strategy):
    strategy = make_strategy(2)
    data = ({"a": IDS, "b": IDS * 2.0}, IDS, np.full(10, 3.0))
    steps = list(sk.shard(data, strategy, global_batch_size=4))
    x, _, w = steps[-1]
    a = [t.numpy().tolist() for t in strategy.experimental_local_results(x["a"])]
    weights = [t.numpy().tolist() for t in strategy.experimental_local_results(w)]
    assert a == [[8, 8], [9, 9]]
    assert weights == [[6.0, 0.0], [6.0, 0.0]]  # user weight 3 x (4 / 2 real examples)


def _dense_model(seed=0):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="tanh"),
                              keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.1), "mse")
    return model


@pytest.mark.parametrize("replicas", [2, 4])
def test_fit_equals_one_device(make_strategy, replicas):
    # 45 = 5 x 8 + 5: full global batches, then a padded one of 5 real examples (over 2
    # replicas 3 + 2, over 4 replicas 2 + 1 + 1 + 1).
    size = 45
    rng = np.random.default_rng(replicas)
    x = rng.normal(size=(size, 3)).astype("float32")
    y = (x @ np.array([1.0, -2.0, 0.5]) + rng.normal(size=size)).astype("float32")
    single = _dense_model()
    single.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)

    strategy = make_strategy(replicas)
    with strategy.scope():
        distributed = _dense_model()
    distributed.fit(sk.shard((x, y), strategy, global_batch_size=8), epochs=2, verbose=0)
    for a, b in zip(single.get_weights(), distributed.get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-5)
    # The weights matter: padding with copies of weight 1 differs.
    with strategy.scope():
        unweighted = _dense_model()
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
    ds = ds.map(lambda a, b: (tf.concat([a, a[:8 - tf.shape(a)[0]]], 0),
                              tf.concat([b, b[:8 - tf.shape(b)[0]]], 0)))
    unweighted.fit(strategy.experimental_distribute_dataset(ds), epochs=2, verbose=0)
    gap = max(np.max(np.abs(a - b)) for a, b in zip(single.get_weights(),
                                                     unweighted.get_weights()))
    assert gap > 1e-4


def _pixel_classifier(loss, seed=0):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((4, 4, 2)), keras.layers.Conv2D(3, 1)])
    model.compile(keras.optimizers.SGD(0.5), loss)
    return model


@pytest.mark.parametrize("labels", ["sparse", "one_hot", "pixel_weights"])
def test_per_pixel_losses_fit_equal_one_device(make_strategy, labels):
    # 4 x 4 label maps, 4 examples per replica: a weight of shape (4,) would silently
    # weigh the 4 columns of every map instead of the examples. The final global batch
    # holds 3 real examples, padded with copies of weight 0: on 4 replicas, one of them
    # holds copies only (test_fit_equals_one_device trains on 2 replicas too).
    replicas = 4
    rng = np.random.default_rng(replicas)
    size = 4 * replicas * 3 + 3
    x = rng.normal(size=(size, 4, 4, 2)).astype("float32")
    y = rng.integers(0, 3, size=(size, 4, 4))
    data = (x, y)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    if labels == "one_hot":
        data = (x, np.eye(3, dtype="float32")[y])
        loss = keras.losses.CategoricalCrossentropy(from_logits=True)
    if labels == "pixel_weights":
        data = (x, y, rng.uniform(0.5, 2.0, size=(size, 4, 4)).astype("float32"))
    single = _pixel_classifier(loss)
    single.fit(*data[:2], sample_weight=data[2] if len(data) == 3 else None,
               batch_size=4 * replicas, epochs=2, shuffle=False, verbose=0)

    strategy = make_strategy(replicas)
    with strategy.scope():
        distributed = _pixel_classifier(loss)
    ds = sk.shard(data, strategy, global_batch_size=4 * replicas)
    distributed.fit(ds, epochs=2, shuffle=False, verbose=0)
    for a, b in zip(single.get_weights(), distributed.get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-5)
    assert sum(len(batch) for step in sk.replica_batches(ds, strategy) for batch in step) == size


def test_padding_keeps_batch_norm_finite_where_an_empty_replica_turns_it_nan(make_strategy):
    strategy = make_strategy(4)
    x = np.random.default_rng(0).normal(size=(18, 3)).astype("float32")  # final batch: 2
    y = x.sum(1)
    with strategy.scope():
        padded, plain = bn_regressor(), bn_regressor()
    padded.fit(sk.shard((x, y), strategy, global_batch_size=8), epochs=1, verbose=0)
    assert all(np.isfinite(w).all() for w in padded.get_weights())
    # Split, and of unknown size (no look-ahead): the final 2 examples leave 2 replicas empty.
    unknown_size = tf.data.Dataset.from_tensor_slices((x, y)).filter(lambda x, y: True)
    plain.fit(sk.shard(unknown_size, strategy, global_batch_size=8, pad_remainder=False),
              epochs=1, verbose=0)
    assert any(np.isnan(w).any() for w in plain.get_weights())


def dense_classifier():
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(4),
                             keras.layers.BatchNormalization(), keras.layers.Dense(2)])


def conv_classifier():
    return keras.Sequential([keras.Input((4, 4, 2)), keras.layers.Conv2D(5, 3),
                             keras.layers.BatchNormalization(), keras.layers.Flatten(),
                             keras.layers.Dense(3)])


@pytest.mark.parametrize(
    ("build", "input_shape", "examples", "batch"),
    [
        # 50 = 3 x 16 + 2: the 2 join the batch before, no replica is empty.
        (dense_classifier, (3,), 50, 16),
        # TensorFlow's CPU convolution returns a wrong shape for an empty batch, so a
        # replica left empty by the final batch (450 = 7 x 64 + 2) would fail evaluate().
        (conv_classifier, (4, 4, 2), 450, 64),
    ],
    ids=["dense", "conv"],
)
def test_evaluate_without_padding_counts_every_example_once(make_strategy, build, input_shape,
                                                            examples, batch):
    strategy = make_strategy(4)
    rng = np.random.default_rng(1)
    x = rng.normal(size=(examples, *input_shape)).astype("float32")
    y = rng.integers(0, 2, size=examples)

    def classifier():
        keras.utils.set_random_seed(0)
        model = build()
        model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"], weighted_metrics=["accuracy"])
        return model

    expected = classifier().evaluate(x, y, batch_size=batch, verbose=0)
    with strategy.scope():
        model = classifier()
    result = model.evaluate(sk.shard((x, y), strategy, global_batch_size=batch,
                                     pad_remainder=False), verbose=0)
    np.testing.assert_allclose(result, expected, rtol=1e-5, atol=1e-6)


def test_custom_training_loop(make_strategy):
    strategy = make_strategy(2)
    ds = sk.shard((IDS.astype("float32"), IDS), strategy, global_batch_size=4)

    @tf.function
    def step(batch):
        def replica_fn(x, y, w):
            return tf.nn.compute_average_loss(x, sample_weight=w, global_batch_size=4)
        per_replica = strategy.run(replica_fn, args=batch)
        return strategy.reduce("SUM", per_replica, axis=None)

    means = [float(step(batch)) for batch in ds]
    assert means == pytest.approx([1.5, 5.5, 8.5])  # the final mean is over 8 and 9 only


def test_several_input_pipelines_read_disjoint_examples():
    # Two simulated workers of 2 replicas each, as distribute_datasets_from_function
    # calls a fn(input_context) that reads its own part.
    parts = []
    for index in range(2):
        context = tf.distribute.InputContext(
            num_input_pipelines=2, input_pipeline_id=index, num_replicas_in_sync=4)
        examples = tf.data.Dataset.from_tensor_slices((IDS, IDS)).shard(2, index)
        batches = make_pipeline(examples, context=context, global_batch_size=4, remainder="pad")
        assert batches.options().experimental_distribute.auto_shard_policy == (
            tf.data.experimental.AutoShardPolicy.OFF)
        parts.append([(x.numpy().tolist(), w.numpy().tolist()) for x, _, w in batches])
    # per-replica batches of 1; each worker's final step is padded for its 2 replicas
    assert parts[0] == [([0], [1.0]), ([2], [1.0]), ([4], [1.0]), ([6], [1.0]),
                        ([8], [2.0]), ([8], [0.0])]
    assert parts[1] == [([1], [1.0]), ([3], [1.0]), ([5], [1.0]), ([7], [1.0]),
                        ([9], [2.0]), ([9], [0.0])]


def test_global_pipeline_shards_by_data_explicitly():
    batches = make_pipeline(tf.data.Dataset.from_tensor_slices((IDS, IDS)),
                            global_batch_size=4, remainder="pad", replicas=2)
    assert batches.options().experimental_distribute.auto_shard_policy == (
        tf.data.experimental.AutoShardPolicy.DATA)


def test_per_replica_batch_size(make_strategy):
    assert sk.per_replica_batch_size(make_strategy(4), 64) == 16
    with pytest.raises(ValueError, match=r"global_batch_size=10 does not divide evenly over "
                                         r"4 replicas.*Use a multiple of 4, such as 8 or 12"):
        sk.per_replica_batch_size(make_strategy(4), 10)
    with pytest.raises(ValueError, match="global_batch_size must be a positive integer"):
        sk.per_replica_batch_size(make_strategy(2), 0)
    with pytest.raises(ValueError, match=r"positive integer. Received: global_batch_size=8.0"):
        sk.per_replica_batch_size(make_strategy(2), 8.0)
    with pytest.raises(ValueError, match="strategy must be a tf.distribute.Strategy"):
        sk.per_replica_batch_size("mirrored", 8)


def test_errors(make_strategy):
    strategy = make_strategy(2)
    with pytest.raises(ValueError, match=r"already batched \(batch found\).*Pass the "
                                         r"dataset before \.batch"):
        sk.shard(tf.data.Dataset.range(10).batch(2).map(lambda x: x), strategy,
                 global_batch_size=4)
    with pytest.raises(ValueError, match=r"fn\(input_context\) is already batched"):
        list(sk.shard(lambda c: tf.data.Dataset.range(4).padded_batch(2), strategy,
                      global_batch_size=4))
    with pytest.raises(ValueError, match="fn.input_context. must be a tf.data.Dataset"):
        list(sk.shard(lambda c: np.arange(4), strategy, global_batch_size=4))
    with pytest.raises(ValueError, match=r"different lengths.*data\[1\]"):
        sk.shard((IDS, IDS[:5]), strategy, global_batch_size=4)
    with pytest.raises(ValueError, match="holds 0 examples"):
        sk.shard((IDS[:0], IDS[:0]), strategy, global_batch_size=4)
    with pytest.raises(ValueError, match="holds 3 examples.*drop_remainder=True"):
        sk.shard(IDS[:3], strategy, global_batch_size=4, drop_remainder=True)
    with pytest.raises(ValueError, match=r"shuffle=True needs a shuffle buffer"):
        sk.shard(lambda c: tf.data.Dataset.range(4), strategy, global_batch_size=4,
                 shuffle=True)
    with pytest.raises(ValueError, match=r"\(x,\), \(x, y\) or \(x, y, sample_weight\)"):
        sk.shard((IDS, IDS, IDS, IDS), strategy, global_batch_size=4)
    with pytest.raises(ValueError, match="Unsupported data for sk.shard"):
        sk.shard("train.csv", strategy, global_batch_size=4)
    with pytest.raises(ValueError, match="one entry per example"):
        sk.shard(3, strategy, global_batch_size=4)
    with pytest.raises(ValueError, match="does not divide evenly over 2 replicas"):
        sk.shard(IDS, strategy, global_batch_size=5)


def test_no_strategy_says_how_to_shard_for_one_device():
    with pytest.raises(ValueError, match=r"strategy must be a tf\.distribute\.Strategy\. "
                       r"Received: strategy=None\. Build one with sk\.mirrored\(replicas=N\) "
                       r"or sk\.from_env\(\), or pass tf\.distribute\.get_strategy\(\) for "
                       r"one device without a strategy"):
        sk.shard((IDS, IDS), None, global_batch_size=4)


def test_batch_detection_relies_on_private_tf_data_api():
    # Fails when tf.data renames `_inputs()` or its batching classes: see sharding.py.
    from strategykit.data.sources import _batching_transformation

    base = tf.data.Dataset.range(10)
    assert _batching_transformation(base.map(lambda x: x).shuffle(3)) is None
    assert _batching_transformation(base.batch(2).unbatch()) is None
    for batched in (base.batch(2), base.padded_batch(2), base.batch(2).rebatch(1),
                    base.ragged_batch(2), base.batch(2, num_parallel_calls=2).prefetch(1)):
        assert _batching_transformation(batched) is not None


def test_strategies_built_in_any_order():
    # sk.mirrored keeps strategies of different sizes apart; shard works with either.
    for replicas in (4, 2):
        strategy = sk.mirrored(cpu_devices(replicas))
        assert len(sk.replica_batches(sk.shard(IDS, strategy, global_batch_size=4),
                                      strategy)) == 3


def test_augmentation_seeds_differ_per_replica_and_repeat_with_the_seed(make_strategy):
    strategy = make_strategy(2)
    zeros = np.zeros((8, 1), "float32")

    def augment(example, seed):
        x, y = example
        return x + tf.random.stateless_uniform([1], seed), y

    def epochs(seed):
        ds = sk.shard((zeros, zeros[:, 0]), strategy, global_batch_size=4, seed=seed,
                      augment=augment)
        result = []
        for epoch in range(2):  # fit sets the epoch as each begins
            position.set_epoch(epoch)
            result.append(sk.replica_batches(ds, strategy))
        return result

    first, second = epochs(5)
    values = [v for step in first for replica in step for v in replica]
    assert len({tuple(v) for v in values}) == 8  # every example, so every replica, differs
    assert first[0][0] != first[0][1]
    assert first != second  # new randomness each epoch
    assert epochs(5)[0] == first  # reproducible from the seed
    assert epochs(6)[0] != first


# Sizes and global batches of the tests above: a final batch of 2 (of 4 or 8), one
# smaller than the replicas, a single example, exact multiples; with the number of steps
# each makes when the final batch is padded, split over 4 replicas (a remainder smaller
# than the replicas joins the batch before it), and dropped. Split over 1 or 2 replicas,
# every remainder here keeps its own step, as padded.
STEP_CASES = {(10, 4): (3, 2, 2), (1, 8): (1, 1, 0), (3, 8): (1, 1, 0), (10, 8): (2, 1, 1),
              (14, 8): (2, 2, 1), (16, 8): (2, 2, 2), (18, 8): (3, 2, 2), (50, 16): (4, 3, 3)}


def _expected_steps(case, remainder, replicas):
    padded, split_on_4, dropped = STEP_CASES[case]
    if remainder == "split" and replicas == 4:
        return split_on_4
    return dropped if remainder == "drop" else padded


# The replicas change the steps only of a split remainder (one smaller than the replicas
# joins the batch before it: a remainder of 1 on 2 replicas, of up to 3 on 4).
@pytest.mark.parametrize("source", ["numpy", "tf.data", "fn"])
@pytest.mark.parametrize(("remainder", "replicas"), [
    ("pad", 1), ("pad", 4), ("drop", 1), ("drop", 4), ("split", 1), ("split", 2), ("split", 4),
])
def test_keras_is_told_the_number_of_steps(make_strategy, source, replicas, remainder):
    # Keras reads `cardinality` as the number of steps (its progress bar's N/N); when it
    # is unknown or wrong, Keras warns "Your input ran out of data" at every end. The
    # steps are hand-written; the test below reads them, so this one starts no
    # distributed iterator in its 21 cases.
    strategy = make_strategy(replicas)
    # The steps follow from the size whatever the source: every case for numpy, for the
    # others one smaller than a batch, one with a remainder and one whose remainder a
    # split on 4 replicas joins to the batch before it.
    cases = STEP_CASES if source == "numpy" else [(1, 8), (14, 8), (18, 8)]
    for size, batch in cases:
        if remainder == "drop" and size < batch:
            continue
        ids = np.arange(size)
        data = {"numpy": (ids, ids), "tf.data": tf.data.Dataset.from_tensor_slices((ids, ids)),
                "fn": lambda context, ids=ids: tf.data.Dataset.from_tensor_slices((ids, ids))}
        ds = sk.shard(data[source], strategy, global_batch_size=batch,
                      drop_remainder=remainder == "drop", pad_remainder=remainder == "pad")
        expected = _expected_steps((size, batch), remainder, replicas)
        assert int(ds.cardinality) == expected, (size, batch)


# A padded remainder's steps do not depend on the replicas; a split one's do.
@pytest.mark.parametrize(("remainder", "replicas"), [("pad", 4), ("split", 2), ("split", 4)])
def test_the_hand_written_steps_are_the_steps_each_replica_reads(make_strategy, remainder,
                                                                 replicas):
    strategy = make_strategy(replicas)
    for size, batch in STEP_CASES:
        ds = sk.shard(np.arange(size), strategy, global_batch_size=batch,
                      pad_remainder=remainder == "pad")
        steps = len(sk.replica_batches(ds, strategy))
        assert steps == _expected_steps((size, batch), remainder, replicas), (size, batch)


@pytest.mark.slow
def test_evaluate_predict_and_fit_run_every_step_without_warnings(make_strategy, capsys):
    strategy = make_strategy(4)
    x = np.random.default_rng(0).normal(size=(50, 3)).astype("float32")  # 3 x 16 + 2
    with strategy.scope():
        model = bn_regressor()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.evaluate(sk.shard((x, x.sum(1)), strategy, global_batch_size=16,
                                pad_remainder=False))
        model.predict(sk.shard(x, strategy, global_batch_size=16, pad_remainder=False))
        for options in ({"pad_remainder": False}, {"drop_remainder": True}):
            model.fit(sk.shard((x, x.sum(1)), strategy, global_batch_size=16, **options),
                      shuffle=False)
    assert not [str(w.message) for w in caught if "ran out of data" in str(w.message)]
    finals = [line.split(" ")[0] for line in progress_lines(capsys.readouterr().out)]
    # Every bar counts to 3, none "Unknown": split 50 = 16 + 16 + 18; dropped, 3 x 16.
    assert {final.split("/")[1] for final in finals} == {"3"}
    assert finals.count("3/3") >= 4


def test_a_list_of_inputs_trains_as_on_one_device(make_strategy):
    # Keras takes fit([x1, x2], y); so does sk.shard, and 4 replicas train as one device,
    # also on the padded final batch (30 = 3 x 8 + 6: 2, 2, 1 and 1 real examples).
    rng = np.random.default_rng(5)
    x1, x2 = rng.normal(size=(30, 3)).astype("float32"), rng.normal(size=(30, 2)).astype(
        "float32")
    y = (x1.sum(axis=1, keepdims=True) - x2[:, :1]).astype("float32")

    def two_inputs():
        keras.utils.set_random_seed(3)
        a, b = keras.Input((3,), name="a"), keras.Input((2,), name="b")
        output = keras.layers.Dense(1)(keras.layers.Concatenate()([a, b]))
        model = keras.Model([a, b], output)
        model.compile(keras.optimizers.SGD(0.1), "mse")
        return model

    one_device = two_inputs()
    one_device.fit([x1, x2], y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    strategy = make_strategy(4)
    with strategy.scope():
        model = two_inputs()
    model.fit(sk.shard(([x1, x2], y), strategy, global_batch_size=8), epochs=2, verbose=0)
    for got, expected in zip(model.get_weights(), one_device.get_weights(), strict=True):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_one_replica_evaluates_as_keras_does_on_numpy_data():
    # Outside any strategy (the default one), sk.shard gives one device the same
    # examples in the same order; its final batch is not padded, so Keras's unweighted
    # metrics and loss count no copies (padded, they did: accuracy 0.50, one device's
    # 0.545).
    x = np.arange(11, dtype="float32")[:, None]
    y = (np.arange(11) % 2).astype("float32")
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1, activation="sigmoid")])
    model.compile("sgd", "binary_crossentropy", metrics=["accuracy"])
    expected = model.evaluate(x, y, batch_size=4, verbose=0, return_dict=True)
    data = sk.shard((x, y), tf.distribute.get_strategy(), global_batch_size=4)
    assert model.evaluate(data, verbose=0, return_dict=True) == pytest.approx(expected)


def test_replica_batches_shows_the_examples_weighed_0_and_hides_only_the_copies(make_strategy):
    strategy = make_strategy(2)
    ids = np.arange(6)
    weights = np.array([1.0, 0.0, 1.0, 0.0, 1.0, 1.0])  # the user weighs 1 and 3 zero
    ds = sk.shard((ids, ids, weights), strategy, global_batch_size=4)
    assert sk.replica_batches(ds, strategy) == [[[0, 1], [2, 3]], [[4], [5]]]
    assert sk.replica_batches(ds, strategy, padding=True)[-1] == [[4, 4], [5, 5]]
