"""sk.shard_tfds on a real multi-file TFDS dataset prepared in a temporary data_dir."""

import importlib
import sys

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

import strategykit as sk
from strategykit.data.tfds_input import prepared_builder, tfds_examples

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
import strategykit as sk

strategy = sk.from_env()
ds = sk.shard_tfds("sharding_toy", "train", strategy, global_batch_size=4,
                   data_dir=sys.argv[1])
print(json.dumps([step[0] for step in sk.replica_batches(ds, strategy)]))
"""


def test_shard_tfds_across_two_workers_gives_every_example_once(data_dir, tmp_path):
    # Each worker reads its own files: 2 of the 4.
    first, second = (w.last_json() for w in run_workers(_ACROSS_WORKERS, 2, args=[data_dir],
                                                         tmp_path=tmp_path))
    assert len(first) == len(second)  # the same steps on both: no replica left waiting
    seen = [i for worker in (first, second) for step in worker for i in step]
    assert sorted(seen) == list(range(EXAMPLES))
    assert not set(i for step in first for i in step) & set(i for step in second for i in step)
