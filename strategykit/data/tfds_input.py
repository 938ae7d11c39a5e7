"""Prepared TFDS datasets, split by files over input pipelines: `shard_tfds`.

Each input pipeline (one per worker) reads its own TFDS files, chosen by
`tfds.ReadConfig(input_context=...)`, and then batches like `sk.shard(fn)`. Nothing is
ever downloaded: a dataset that is not prepared in `data_dir` is an error that says how
to prepare it.

TFDS forgets the number of examples of a read given an `input_context` (its
`assert_cardinality` is skipped then), so Keras would see an epoch of unknown steps
(`1/Unknown`). The split's metadata knows each file's examples
(`info.splits[split].file_instructions`, slices such as `"train[:80%]"` included), and
TFDS gives pipeline `i` of `n` the files `i, i + n, ...`: `pipeline_sizes` counts each
pipeline's examples, and `tfds_examples` states its own. Under
`tfds.testing.mock_data` there are no files: the mocked examples are read as TFDS gives
them (of the size `num_examples`), split by example over several pipelines.
"""

from __future__ import annotations

import tensorflow as tf

from strategykit.cluster.roles import is_multi_worker
from strategykit.data import predict_input
from strategykit.data.shard_arguments import check_seed, check_shuffle_buffer
from strategykit.data.sharding import note_new_order_every_pass, shard


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
    if not builder.is_prepared() and not is_mocked(builder):
        raise ValueError(
            f"TFDS dataset {name!r} is not prepared in {where}, and strategykit never "
            f"downloads. Received: name={name!r}, data_dir={data_dir!r}. Prepare it first: "
            f"`tfds build {name} --data_dir=<dir>` (or builder.download_and_prepare()), "
            "then pass that data_dir."
        )
    return builder


def is_mocked(builder) -> bool:
    """Whether `builder` reads examples without prepared files: `tfds.testing.mock_data`.

    Under the mock, `is_prepared()` is False (its data_dir holds metadata at most) and
    `as_dataset` gives random examples; on a builder that is really not prepared,
    `as_dataset` raises at once, before it reads anything.
    """
    if builder.is_prepared():
        return False
    try:
        builder.as_dataset(split=next(iter(builder.info.splits), "train"))
    except Exception:  # noqa: BLE001 (TFDS: AssertionError "could not find data in ...")
        return False  # not prepared: the caller's error says how to prepare it
    return True


def pipeline_sizes(builder, split: str, pipelines: int) -> list[int]:
    """The examples each of `pipelines` input pipelines reads of a prepared split.

    TFDS gives pipeline `i` the split's files `i, i + pipelines, ...`, each read as
    its file instruction says (`take` examples, less in a sliced split).

    Example:
        >>> from strategykit.data.tfds_input import pipeline_sizes, prepared_builder
        >>> builder = prepared_builder("mnist", "/data/tfds")  # doctest: +SKIP
        >>> pipeline_sizes(builder, "train", 2)  # doctest: +SKIP
        [30000, 30000]
    """
    files = builder.info.splits[split].file_instructions
    return [sum(file.take for file in files[i::pipelines]) for i in range(pipelines)]


def split_by_example(examples: tf.data.Dataset,
                     context: tf.distribute.InputContext | None) -> tf.data.Dataset:
    """One input pipeline's part of examples read whole (`tfds.testing.mock_data`'s,
    which has no files to split): every `n`-th example from the pipeline's index on.

    Its cardinality is known when every pipeline gets equally many (always with one),
    so that every worker counts the same steps; otherwise each is read to its end.

    Example:
        >>> import tensorflow as tf
        >>> from strategykit.data.tfds_input import split_by_example
        >>> context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=1)
        >>> [int(i) for i in split_by_example(tf.data.Dataset.range(6), context)]
        [1, 3, 5]
    """
    pipelines = context.num_input_pipelines if context is not None else 1
    if pipelines == 1:
        return examples
    size = int(examples.cardinality())
    examples = examples.shard(pipelines, context.input_pipeline_id)
    if size >= 0 and size % pipelines:  # unequal parts: no count every worker shares
        examples = examples.filter(lambda *_: True)  # tf.data then counts none
    return examples


def tfds_examples(builder, split: str, context: tf.distribute.InputContext | None = None,
                  *, shuffle: bool = False, seed: int | None = None,
                  as_supervised: bool = True) -> tf.data.Dataset:
    """The unbatched examples of one input pipeline: its own files of `split`.

    With `context`, files are assigned to pipelines by `tfds.ReadConfig(input_context=
    context)`: pipeline `i` of `n` reads every file `j` with `j % n == i` (TFDS's rule).
    The dataset's cardinality is its number of examples (`pipeline_sizes`) when every
    pipeline reads equally many (always with one), so that every worker counts the same
    steps; otherwise it is unknown, and each pipeline is read to its end.

    Raises:
        ValueError: the split has fewer files than there are input pipelines.

    Example:
        >>> import tensorflow as tf
        >>> from strategykit.data.tfds_input import prepared_builder, tfds_examples
        >>> builder = prepared_builder("mnist", "/data/tfds")  # doctest: +SKIP
        >>> context = tf.distribute.InputContext(num_input_pipelines=2,
        ...                                      input_pipeline_id=0)
        >>> int(tfds_examples(builder, "train", context).cardinality())  # doctest: +SKIP
        30000
    """
    import tensorflow_datasets as tfds

    pipelines = context.num_input_pipelines if context is not None else 1
    files = len(builder.info.splits[split].file_instructions)
    if context is not None and pipelines > files:
        raise ValueError(
            f"Split {split!r} of {builder.name!r} has {files} file(s), fewer than the "
            f"{pipelines} input pipelines that would each read their own "
            f"files. Received: num_input_pipelines={pipelines}. Prepare "
            "it with more shards (tfds.download.DownloadConfig(num_shards=...)), or use "
            "sk.shard on the examples to split by data."
        )
    config = tfds.ReadConfig(input_context=context, shuffle_seed=seed,
                             shuffle_reshuffle_each_iteration=True)
    examples = builder.as_dataset(split=split, shuffle_files=shuffle, read_config=config,
                                  as_supervised=as_supervised)
    sizes = pipeline_sizes(builder, split, pipelines)
    if context is not None and len(set(sizes)) == 1:
        # TFDS states no cardinality given an input_context; tf.data raises at the end
        # of a pass that holds another number of examples.
        examples = examples.apply(tf.data.experimental.assert_cardinality(
            sizes[context.input_pipeline_id]))
    return examples


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

    Keras is told the steps of an epoch, counted from the split's metadata (TFDS itself
    forgets them when each worker reads its own files): the progress bar counts to
    `N/N`, with or without `steps_per_epoch`. Across workers that holds when every
    worker's files hold as many examples; otherwise each worker reads its own to the end.

    Under `tfds.testing.mock_data` it reads the mocked examples (`num_examples` of
    them, whatever the split; `data_dir` is ignored, as by the mock), and the dataset
    stays usable after the `with` block; across workers each takes every `n`-th one.

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
        >>> int(ds.cardinality)  # 60000 / 64, the last step padded  # doctest: +SKIP
        938

        In a test, on mocked data:

        >>> import tensorflow_datasets as tfds
        >>> with tfds.testing.mock_data(num_examples=10):  # doctest: +SKIP
        ...     ds = sk.shard_tfds("mnist", "train", strategy, global_batch_size=4)
        >>> int(ds.cardinality)  # doctest: +SKIP
        3
    """
    for argument, value in (("name", name), ("split", split)):
        if not isinstance(value, str):
            raise ValueError(
                f"{argument} must be a string. Received: {argument}={value!r}. Pass e.g. "
                + ("name='mnist', a TFDS dataset name." if argument == "name"
                   else "split='train' (or 'test', 'train[:80%]')."))
    check_seed(seed)  # before TFDS reads anything
    check_shuffle_buffer(shuffle_buffer)
    builder = prepared_builder(name, data_dir)
    size = _split_size(builder, split)
    if builder.is_prepared():
        def examples(context):
            return tfds_examples(builder, split, context, shuffle=shuffle, seed=seed,
                                 as_supervised=as_supervised)
    else:  # tfds.testing.mock_data: read once, so that the data outlives the mock
        mocked = builder.as_dataset(split=split, as_supervised=as_supervised)
        size = _known(int(mocked.cardinality()))

        def examples(context):
            return split_by_example(mocked, context)
    distributed = shard(
        examples, strategy, global_batch_size=global_batch_size, shuffle=shuffle, seed=seed,
        drop_remainder=drop_remainder, pad_remainder=pad_remainder,
        shuffle_buffer=shuffle_buffer or size, augment=augment,
    )
    what = f"sk.shard_tfds({name!r}, {split!r}, ...)"
    if shuffle and builder.is_prepared():  # TFDS's file order is the iteration's, not the epoch's
        note_new_order_every_pass(
            distributed, "reads the split's files in a new order every pass "
            f"({what} with shuffle=True)", f"pass {what} with shuffle=False, or the split's "
            "examples to sk.shard(..., shuffle=True, seed=<an int>)")
    if is_multi_worker(strategy):
        predict_input.refuse(distributed, predict_input.across_workers_message(
            what, strategy, "For predict(), pass the split's examples to sk.shard, which "
            "every worker reads whole: sk.shard(builder.as_dataset(split=..., "
            "as_supervised=True), strategy, ...)."))
    elif shuffle:
        predict_input.refuse(distributed, predict_input.shuffled_files_message(what))
    return distributed


def _split_size(builder, split: str) -> int | None:
    """The examples of `split` by its metadata; raises ValueError for a split the
    dataset does not have. Under `tfds.testing.mock_data` without metadata every split
    name is accepted, as TFDS does (None: the mock's data counts its own)."""
    if not builder.info.splits and not builder.is_prepared():
        return None
    try:
        return _known(builder.info.splits[split].num_examples)
    except (KeyError, ValueError) as error:
        raise ValueError(
            f"TFDS dataset {builder.name!r} has no split {split!r} ({error}). Received: "
            f"split={split!r}. Use one of {sorted(builder.info.splits)}, optionally sliced "
            "as in 'train[:80%]'."
        ) from None


def _known(size: int | None) -> int | None:
    return size if size is not None and size >= 0 else None
