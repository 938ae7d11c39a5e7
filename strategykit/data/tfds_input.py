"""Prepared TFDS datasets, split by files over input pipelines: `shard_tfds`.

Each input pipeline (one per worker) reads its own TFDS files, chosen by
`tfds.ReadConfig(input_context=...)`, and then batches like `sk.shard(fn)`. Nothing is
ever downloaded: a dataset that is not prepared in `data_dir` is an error that says how
to prepare it.
"""

from __future__ import annotations

import tensorflow as tf

from strategykit.cluster.roles import is_multi_worker
from strategykit.data import predict_input
from strategykit.data.sharding import shard


def prepared_builder(name: str, data_dir: str | None = None):
    """The TFDS builder of a dataset prepared in `data_dir`; never downloads.

    Args:
        name: the TFDS name, e.g. `"mnist"` or `"mnist:3.0.1"`.
        data_dir: where it is prepared. Default: TFDS's default (`~/tensorflow_datasets`).

    Returns:
        A `tfds.core.DatasetBuilder` whose data is on disk.

    Raises:
        ValueError: the name is unknown to TFDS and not found in `data_dir`, or the
            dataset is not prepared there.

    Example:
        >>> from strategykit.data.tfds_input import prepared_builder
        >>> builder = prepared_builder("mnist", "/data/tfds")  # doctest: +SKIP
        >>> builder.info.splits["train"].num_examples  # doctest: +SKIP
        60000
    """
    import tensorflow_datasets as tfds

    where = data_dir or "TFDS's default data_dir (~/tensorflow_datasets)"
    try:
        builder = tfds.builder(name, data_dir=data_dir)
    except tfds.core.registered.DatasetNotFoundError:
        raise ValueError(
            f"Unknown TFDS dataset {name!r}: TFDS has no builder of that name and none is "
            f"prepared in {where}. Received: name={name!r}, data_dir={data_dir!r}. Check "
            "the name (tfds.list_builders()) or pass the data_dir it is prepared in."
        ) from None
    if not builder.is_prepared():
        raise ValueError(
            f"TFDS dataset {name!r} is not prepared in {where}, and strategykit never "
            f"downloads. Received: name={name!r}, data_dir={data_dir!r}. Prepare it first: "
            f"`tfds build {name} --data_dir=<dir>` (or builder.download_and_prepare()), "
            "then pass that data_dir."
        )
    return builder


def tfds_examples(builder, split: str, context: tf.distribute.InputContext | None = None,
                  *, shuffle: bool = False, seed: int | None = None,
                  as_supervised: bool = True) -> tf.data.Dataset:
    """The unbatched examples of one input pipeline: its own files of `split`.

    With `context`, files are assigned to pipelines by `tfds.ReadConfig(input_context=
    context)`: pipeline `i` of `n` reads every file `j` with `j % n == i` (TFDS's rule).

    Raises:
        ValueError: the split has fewer files than there are input pipelines.
    """
    import tensorflow_datasets as tfds

    files = len(builder.info.splits[split].file_instructions)
    if context is not None and context.num_input_pipelines > files:
        raise ValueError(
            f"Split {split!r} of {builder.name!r} has {files} file(s), fewer than the "
            f"{context.num_input_pipelines} input pipelines that would each read their own "
            f"files. Received: num_input_pipelines={context.num_input_pipelines}. Prepare "
            "it with more shards (tfds.download.DownloadConfig(num_shards=...)), or use "
            "sk.shard on the examples to split by data."
        )
    config = tfds.ReadConfig(input_context=context, shuffle_seed=seed,
                             shuffle_reshuffle_each_iteration=True)
    return builder.as_dataset(split=split, shuffle_files=shuffle, read_config=config,
                              as_supervised=as_supervised)


def shard_tfds(
    name: str,
    split: str,
    strategy: tf.distribute.Strategy,
    *,
    global_batch_size: int,
    data_dir: str | None = None,
    as_supervised: bool = True,
    shuffle: bool = False,
    seed: int | None = None,
    drop_remainder: bool = False,
    pad_remainder: bool = True,
    shuffle_buffer: int | None = None,
    augment=None,
) -> tf.distribute.DistributedDataset:
    """A prepared TFDS split as per-replica batches, each worker reading its own files.

    Batching, sample weights and the final partial batch are those of `sk.shard` (see
    there): elements are `(x, y, sample_weight)` with `as_supervised=True`.
    `model.predict` of the result returns one row per example in the split's order, on
    one worker and with `shuffle=False` (otherwise it refuses: no such order is known).

    Args:
        name: the TFDS name, e.g. `"mnist"`.
        split: the split, e.g. `"train"` or `"train[:80%]"`.
        strategy: the `tf.distribute.Strategy`.
        global_batch_size: examples per step over all replicas; a multiple of them.
        data_dir: where the dataset is prepared. Default: TFDS's default.
        as_supervised: read `(input, label)` pairs. Default True; False gives feature
            dicts, which carry no sample weights.
        shuffle: shuffle the files and the examples, anew each epoch. Default False.
        seed: seed of both shuffles. Default None (random).
        drop_remainder: drop the final partial batch. Default False.
        pad_remainder: pad it (`sk.shard`). Default True.
        shuffle_buffer: example shuffle buffer. Default: the split's size.
        augment: `(example, seed) -> example` per example, as in `sk.shard`.

    Returns:
        A `tf.distribute.DistributedDataset`.

    Raises:
        ValueError: the dataset is unknown or not prepared, the split does not exist,
            or the batch size does not divide over the replicas.

    Example:
        >>> import strategykit as sk
        >>> strategy = sk.mirrored(replicas=2)  # doctest: +SKIP
        >>> ds = sk.shard_tfds("mnist", "train", strategy, global_batch_size=64,
        ...                    data_dir="/data/tfds", shuffle=True, seed=0)  # doctest: +SKIP
    """
    for argument, value in (("name", name), ("split", split)):
        if not isinstance(value, str):
            raise ValueError(
                f"{argument} must be a string. Received: {argument}={value!r}. Pass e.g. "
                + ("name='mnist', a TFDS dataset name." if argument == "name"
                   else "split='train' (or 'test', 'train[:80%]')."))
    builder = prepared_builder(name, data_dir)
    try:
        size = builder.info.splits[split].num_examples
    except (KeyError, ValueError) as error:
        raise ValueError(
            f"TFDS dataset {name!r} has no split {split!r} ({error}). Received: split="
            f"{split!r}. Use one of {sorted(builder.info.splits)}, optionally sliced as in "
            "'train[:80%]'."
        ) from None
    distributed = shard(
        lambda context: tfds_examples(builder, split, context, shuffle=shuffle, seed=seed,
                                      as_supervised=as_supervised),
        strategy, global_batch_size=global_batch_size, shuffle=shuffle, seed=seed,
        drop_remainder=drop_remainder, pad_remainder=pad_remainder,
        shuffle_buffer=shuffle_buffer or size, augment=augment,
    )
    what = f"sk.shard_tfds({name!r}, {split!r}, ...)"
    if is_multi_worker(strategy):
        predict_input.refuse(distributed, predict_input.across_workers_message(
            what, strategy, "For predict(), pass the split's examples to sk.shard, which "
            "every worker reads whole: sk.shard(builder.as_dataset(split=..., "
            "as_supervised=True), strategy, ...)."))
    elif shuffle:
        predict_input.refuse(distributed, predict_input.shuffled_files_message(what))
    return distributed
