"""sk.shard_tfds on a real multi-file TFDS dataset prepared in a temporary data_dir."""

import importlib
import os
import sys
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

import strategykit as sk
from strategykit.data.tfds_input import (
    pipeline_sizes,
    prepared_builder,
    split_by_example,
    tfds_examples,
)

from conftest import progress_lines
from workers import run_workers

EXAMPLES = 22
FILES = 4


# TFDS reads a builder's metadata from the package that holds it, so the builder is
# written as a small package into a temporary folder and imported from there.
BUILDER_SOURCE = f"""
import tensorflow as tf
import tensorflow_datasets as tfds


class ShardingToy(tfds.core.GeneratorBasedBuilder):
    \"\"\"{EXAMPLES} examples (id, label = id % 3), written into several files.\"\"\"

    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
        return self.dataset_info_from_configs(
            features=tfds.features.FeaturesDict(
                {{"id": tf.int64, "label": tfds.features.ClassLabel(num_classes=3)}}),
            supervised_keys=("id", "label"),
        )

    def _split_generators(self, dl_manager):
        return {{"train": self._generate_examples()}}

    def _generate_examples(self):
        for i in range({EXAMPLES}):
            yield i, {{"id": i, "label": i % 3}}
"""


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("builder")
    package = root / "sk_toy_datasets"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "sharding_toy.py").write_text(BUILDER_SOURCE)
    sys.path.insert(0, str(root))
    try:
        module = importlib.import_module("sk_toy_datasets.sharding_toy")
    finally:
        sys.path.remove(str(root))
    directory = str(tmp_path_factory.mktemp("tfds"))
    module.ShardingToy(data_dir=directory).download_and_prepare(
        download_config=tfds.download.DownloadConfig(num_shards=FILES))
    return directory


def _files_of_ids(builder):
    """The ids each file of the train split holds, read back with TFDS's example ids."""
    config = tfds.ReadConfig(add_tfds_id=True)
    files = {}
    for example in builder.as_dataset(split="train", read_config=config):
        name = example["tfds_id"].numpy().decode().rsplit("__", 1)[0]
        files.setdefault(name, set()).add(int(example["id"]))
    return list(files.values())


def test_the_toy_dataset_has_several_files(data_dir):
    builder = prepared_builder("sharding_toy", data_dir)
    assert len(builder.info.splits["train"].shard_lengths) == FILES
    assert builder.info.splits["train"].num_examples == EXAMPLES


def test_two_input_pipelines_read_disjoint_files_that_cover_the_split(data_dir):
    builder = prepared_builder("sharding_toy", data_dir)
    files = _files_of_ids(builder)
    assert len(files) == FILES
    read = []
    for index in range(2):
        context = tf.distribute.InputContext(
            num_input_pipelines=2, input_pipeline_id=index, num_replicas_in_sync=4)
        ids = [int(i) for i, _ in tfds_examples(builder, "train", context)]
        assert len(ids) == len(set(ids))
        read.append(set(ids))
        # whole files only: each file is read entirely by this pipeline or not at all
        assert all(file <= read[-1] or not file & read[-1] for file in files)
    assert not read[0] & read[1]
    assert read[0] | read[1] == set(range(EXAMPLES))
    assert read[0] and read[1]


@pytest.mark.parametrize("replicas", [2, 4])
def test_shard_tfds_gives_every_example_once(make_strategy, data_dir, replicas):
    strategy = make_strategy(replicas)
    ds = sk.shard_tfds("sharding_toy", "train", strategy, global_batch_size=8,
                       data_dir=data_dir)
    steps = sk.replica_batches(ds, strategy)
    order = [int(i) for i, _ in tfds_examples(prepared_builder("sharding_toy", data_dir),
                                              "train")]  # TFDS's own reading order
    per_replica = 8 // replicas
    assert steps[0] == [order[k * per_replica:(k + 1) * per_replica] for k in range(replicas)]
    seen = [i for step in steps for replica in step for i in replica]
    assert sorted(seen) == list(range(EXAMPLES))  # 22 = 2 x 8 + 6: the padded final step
    padded = sk.replica_batches(ds, strategy, padding=True)
    assert all(len(batch) == 8 // replicas for step in padded for batch in step)


def test_shard_tfds_shuffles_reproducibly(make_strategy, data_dir):
    strategy = make_strategy(2)

    def epoch_orders(seed):
        ds = sk.shard_tfds("sharding_toy", "train", strategy, global_batch_size=4,
                           data_dir=data_dir, shuffle=True, seed=seed)
        return [sk.replica_batches(ds, strategy) for _ in range(2)]

    first, second = epoch_orders(7)
    assert first != second
    assert epoch_orders(7)[0] == first
    for epoch in (first, second):
        seen = sorted(i for step in epoch for replica in step for i in replica)
        assert seen == list(range(EXAMPLES))


def test_labels_follow_their_examples(make_strategy, data_dir):
    strategy = make_strategy(2)
    ds = sk.shard_tfds("sharding_toy", "train[:50%]", strategy, global_batch_size=4,
                       data_dir=data_dir)
    for x, y, _ in ds:
        for xr, yr in zip(strategy.experimental_local_results(x),
                          strategy.experimental_local_results(y)):
            np.testing.assert_array_equal(yr.numpy(), xr.numpy() % 3)


def test_each_pipeline_knows_its_examples(data_dir):
    # TFDS forgets the count given an input_context; the split's file instructions keep
    # it, sliced splits too (the toy's files hold 6, 5, 5, 6; train[:80%] 6, 5, 5, 2).
    builder = prepared_builder("sharding_toy", data_dir)
    for split, pipelines in (("train", 1), ("train", 2), ("train[:80%]", 1),
                             ("train[:80%]", 2), ("train", 4)):
        sizes = pipeline_sizes(builder, split, pipelines)
        for index, size in enumerate(sizes):
            context = tf.distribute.InputContext(
                num_input_pipelines=pipelines, input_pipeline_id=index)
            examples = tfds_examples(builder, split, context)
            assert sum(1 for _ in examples) == size, (split, pipelines, index)
            # stated where every pipeline reads as many, so every worker counts alike
            stated = size if len(set(sizes)) == 1 else tf.data.UNKNOWN_CARDINALITY
            assert int(examples.cardinality()) == stated, (split, pipelines, index)
    assert pipeline_sizes(builder, "train", 2) == [11, 11]
    assert pipeline_sizes(builder, "train[:80%]", 2) == [11, 7]


class _Steps(keras.callbacks.Callback):
    """The steps of an epoch as Keras sees them (its progress bar's N)."""

    def on_train_begin(self, logs=None):
        self.steps = self.params["steps"]


def _id_regressor():
    return keras.Sequential([
        keras.Input((), dtype="int64"),
        keras.layers.CategoryEncoding(num_tokens=EXAMPLES, output_mode="one_hot"),
        keras.layers.Dense(2, activation="tanh",
                           kernel_initializer=keras.initializers.GlorotUniform(seed=1)),
        keras.layers.Dense(1, kernel_initializer=keras.initializers.GlorotUniform(seed=2)),
    ])


def _compiled(model):
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    return model


def _no_ran_out_warning(caught):
    assert not [str(w.message) for w in caught if "ran out of data" in str(w.message)]


@pytest.mark.parametrize(("replicas", "split", "steps"),
                         [(2, "train", 3), (4, "train[:80%]", 3)])
def test_keras_sees_the_steps_and_trains_as_one_device(make_strategy, data_dir, float64,
                                                       capsys, replicas, split, steps):
    # 22 (or 18) examples by 8: a padded final step. Keras is told the steps, so the bar
    # counts to N/N, and with steps_per_epoch (keras.io's TFDS recipes) no epoch runs out
    # of data; both train as one device on the global batch.
    strategy = make_strategy(replicas)
    builder = prepared_builder("sharding_toy", data_dir)
    ids, labels = (np.array(part) for part in zip(*[
        (int(i), float(y)) for i, y in tfds_examples(builder, split)]))  # TFDS's order
    reference = _compiled(_id_regressor())
    reference.fit(ids, labels, batch_size=8, epochs=2, shuffle=False, verbose=0)
    with strategy.scope():
        model = _compiled(_id_regressor())
    initial = model.get_weights()
    for fit_options in ({}, {"steps_per_epoch": steps}):
        model.set_weights(initial)
        seen = _Steps()
        ds = sk.shard_tfds("sharding_toy", split, strategy, global_batch_size=8,
                           data_dir=data_dir)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model.fit(ds, epochs=2, shuffle=False, verbose=1, callbacks=[seen], **fit_options)
        _no_ran_out_warning(caught)
        assert seen.steps == steps
        bars = progress_lines(capsys.readouterr().out)
        assert bars and not [bar for bar in bars if "Unknown" in bar]
        counts = [bar.split(" ")[0] for bar in bars]  # Keras redraws a bar on a timer:
        assert counts.count(f"{steps}/{steps}") >= 2  # each epoch's ends at N/N, maybe twice
        assert {count.split("/")[1] for count in counts} == {str(steps)}
        for got, want in zip(model.get_weights(), reference.get_weights()):
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_shuffled_tfds_files_are_backed_up_at_epoch_ends_only(make_strategy, data_dir,
                                                              tmp_path):
    # TFDS draws a new file order every pass, whatever the seed (the order of a pass is the
    # iteration's, not the epoch's): a resume at a step of the epoch would skip other
    # examples than those done, so save_freq=N backs up at epoch ends instead.
    strategy = make_strategy(2)
    ds = sk.shard_tfds("sharding_toy", "train", strategy, global_batch_size=8,
                       data_dir=data_dir, shuffle=True, seed=7)
    with strategy.scope():
        model = _compiled(_id_regressor())
    backup = sk.callbacks.BackupAndRestore(tmp_path / "b", save_freq=1,
                                           delete_checkpoint=False)
    with pytest.warns(UserWarning, match=(
            r"BackupAndRestore\(save_freq=1\) backs up in the middle of an epoch only on "
            r"data whose pass can start at any step, and this fit\(\)'s sk\.shard data reads "
            r"the split's files in a new order every pass \(sk\.shard_tfds\('sharding_toy', "
            r"'train', \.\.\.\) with shuffle=True\): .* For a backup every 1 batches, pass "
            r"sk\.shard_tfds\('sharding_toy', 'train', \.\.\.\) with shuffle=False")):
        model.fit(ds, epochs=1, verbose=0, shuffle=False, callbacks=[backup])
    (written,) = backup.backups()
    assert os.path.basename(written) == "backup-000000"  # the epoch's end, not 3 steps


def test_shard_tfds_under_mock_data(make_strategy):
    # Users test their pipelines with tfds.testing.mock_data, which mocks every dataset
    # (nothing prepared, no files, any split): sk.shard_tfds reads the mocked examples,
    # of the mock's size, and its data outlives the mock, as tfds.load's does.
    strategy = make_strategy(2)
    with tfds.testing.mock_data(num_examples=10):
        ds = sk.shard_tfds("mnist", "train", strategy, global_batch_size=4,
                           data_dir="/nonexistent/tfds")
        labels = [int(y) for _, y in tfds.load("mnist", split="train", as_supervised=True)]
        assert int(ds.cardinality) == 3  # 10 = 4 + 4 + 2, padded
        sliced = sk.shard_tfds("mnist", "train[:50%]", strategy, global_batch_size=4)
        assert int(sliced.cardinality) == 3  # the mock ignores slices, as tfds.load does
    got = []
    for _, y, weight in ds:
        for yr, wr in zip(strategy.experimental_local_results(y),
                          strategy.experimental_local_results(weight)):
            got += [int(label) for label, w in zip(yr.numpy(), wr.numpy().ravel())
                    if not (w == 0 and np.signbit(w))]  # not the padded copies
    assert got == labels  # every mocked example once, in the mock's order
    with strategy.scope():
        model = keras.Sequential([keras.Input((28, 28, 1)), keras.layers.Flatten(),
                                  keras.layers.Rescaling(1 / 255), keras.layers.Dense(10)])
        model.compile(optimizer="sgd",
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    seen = _Steps()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history = model.fit(ds, epochs=2, shuffle=False, verbose=0, callbacks=[seen])
    _no_ran_out_warning(caught)
    assert seen.steps == 3 and np.all(np.isfinite(history.history["loss"]))


def test_mocked_examples_are_split_by_example_over_pipelines():
    # The mock has no files to give each worker its own: each pipeline takes every n-th
    # example, with a count only when all get as many (every worker the same steps).
    for size, known in ((10, True), (9, False)):
        parts = [list(split_by_example(tf.data.Dataset.range(size), tf.distribute.InputContext(
            num_input_pipelines=2, input_pipeline_id=index))) for index in range(2)]
        assert sorted(int(i) for part in parts for i in part) == list(range(size))
        assert not {int(i) for i in parts[0]} & {int(i) for i in parts[1]}
        cardinality = int(split_by_example(tf.data.Dataset.range(size),
                                           tf.distribute.InputContext(2, 0)).cardinality())
        assert cardinality == (5 if known else tf.data.UNKNOWN_CARDINALITY)
    assert int(split_by_example(tf.data.Dataset.range(9), None).cardinality()) == 9


def test_errors(make_strategy, data_dir, tmp_path):
    strategy = make_strategy(2)
    with pytest.raises(ValueError, match=r"Unknown TFDS dataset 'no_such_toy'.*"
                                         r"tfds.list_builders"):
        prepared_builder("no_such_toy", str(tmp_path))
    with pytest.raises(ValueError, match=r"'sharding_toy' is not prepared in .*never "
                                         r"downloads.*tfds build sharding_toy"):
        sk.shard_tfds("sharding_toy", "train", strategy, global_batch_size=4,
                      data_dir=str(tmp_path / "empty"))
    with pytest.raises(ValueError, match=r"has no split 'test'.*Use one of \['train'\]"):
        sk.shard_tfds("sharding_toy", "test", strategy, global_batch_size=4,
                      data_dir=data_dir)
    with pytest.raises(ValueError, match="does not divide evenly over 2 replicas"):
        sk.shard_tfds("sharding_toy", "train", strategy, global_batch_size=3,
                      data_dir=data_dir)
    context = tf.distribute.InputContext(num_input_pipelines=5, input_pipeline_id=0,
                                         num_replicas_in_sync=5)
    with pytest.raises(ValueError, match=r"has 4 file\(s\), fewer than the 5 input pipelines"):
        tfds_examples(prepared_builder("sharding_toy", data_dir), "train", context)


_ACROSS_WORKERS = """
import json, sys
import keras
import strategykit as sk

strategy = sk.from_env()
ds = sk.shard_tfds("sharding_toy", "train", strategy, global_batch_size=4,
                   data_dir=sys.argv[1])
with strategy.scope():
    model = keras.Sequential([keras.Input(()), keras.layers.Reshape((1,)),
                              keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
history = model.fit(ds, epochs=2, shuffle=False, verbose=0)
print(json.dumps({"batches": [step[0] for step in sk.replica_batches(ds, strategy)],
                  "cardinality": int(ds.cardinality), "steps": history.params["steps"]}))
"""


@pytest.mark.slow
def test_shard_tfds_across_two_workers_gives_every_example_once(data_dir, tmp_path):
    # Each worker reads its own files: 2 of the 4, 11 examples each (6 + 5, 5 + 6), so
    # both count 6 steps of 2 (the last padded), and Keras is told them on both.
    ended = [w.last_json() for w in run_workers(_ACROSS_WORKERS, 2, args=[data_dir],
                                                tmp_path=tmp_path)]
    assert [(w["cardinality"], w["steps"]) for w in ended] == [(6, 6), (6, 6)]
    first, second = (w["batches"] for w in ended)
    assert len(first) == len(second)  # the same steps on both: no replica left waiting
    seen = [i for worker in (first, second) for step in worker for i in step]
    assert sorted(seen) == list(range(EXAMPLES))
    assert not set(i for step in first for i in step) & set(i for step in second for i in step)
