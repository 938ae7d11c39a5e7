"""Different data for each replica: `shard`, `per_replica_batch_size`.

`shard` splits numpy arrays, an unbatched `tf.data.Dataset` or a function
`fn(input_context) -> tf.data.Dataset` into per-replica batches: every example once, no
replica ever empty (see `strategykit.data.batching` for the final partial batch). The worked
example, `range(10)` over 2 replicas with a global batch of 4 (per-replica batch 2):

    step   replica 0   replica 1
    0      [0, 1]      [2, 3]
    1      [4, 5]      [6, 7]
    2      [8]         [9]        (each padded with one copy of weight -0.0)
"""

from __future__ import annotations

import functools
import weakref

import tensorflow as tf

from strategykit import upstream
from strategykit.cluster.roles import is_multi_worker
from strategykit.cluster.strategy_argument import check_strategy
from strategykit.data import predict_input
from strategykit.data.batching import split_labels
from strategykit.data.pipeline import make_pipeline
from strategykit.data.shard_arguments import (
    INT32_MAX,
    check_count,
    check_seed,
    check_shuffle_buffer,
    check_size,
)
from strategykit.data.sources import examples_source
from strategykit.data.stream import EpochStream, PassEachEpoch, attach_stream
from strategykit.made import model_scope, remade_data, strategies
from strategykit.upstream import state_steps

# distributed dataset made here (they carry weights) -> its global batch size
_GLOBAL_BATCH = weakref.WeakKeyDictionary()
_NEW_ORDER = weakref.WeakKeyDictionary()  # those whose every pass is in a new order


def global_batch_size_of(dataset) -> int | None:
    """The `global_batch_size` that `sk.shard` made `dataset` with; None for any other
    data (a backup counts the examples of its steps in it)."""
    try:
        return _GLOBAL_BATCH.get(dataset)
    except TypeError:  # not weakly referable: not one of sk.shard's
        return None


def new_order_every_pass(dataset) -> tuple[str, str] | None:
    """Why every pass of `dataset`, one of `sk.shard`'s, is in a new order, and the fix,
    for messages; None where the passes of an epoch repeat one order (no shuffle, or one
    keyed by a seed and the epoch), and for other data."""
    try:
        return _NEW_ORDER.get(dataset)
    except TypeError:  # not weakly referable: not one of sk.shard's
        return None


def note_new_order_every_pass(dataset, why: str, fix: str) -> None:
    """Notes that every pass of `dataset` is in a new order: `why`, and `fix` for that."""
    _NEW_ORDER[dataset] = why, fix


def per_replica_batch_size(strategy: tf.distribute.Strategy, global_batch_size: int) -> int:
    """The examples each replica gets per step: `global_batch_size / replicas`.

    Args:
        strategy: the `tf.distribute.Strategy` the batches are for.
        global_batch_size: examples per step over all replicas.

    Returns:
        The per-replica batch size.

    Raises:
        ValueError: `global_batch_size` is not a positive multiple of the replicas, or
            not below 2**31 (tf.data's batch sizes are int32).

    Example:
        >>> import strategykit as sk
        >>> sk.per_replica_batch_size(sk.mirrored(replicas=2), 64)  # doctest: +SKIP
        32
    """
    check_strategy(strategy)
    replicas = strategy.num_replicas_in_sync
    check_count("global_batch_size", global_batch_size, low=1, high=INT32_MAX,
                example=32 * replicas, what="a positive integer",
                too_large=", above 2**31 - 1 (tf.data's batch sizes are int32)")
    if global_batch_size % replicas:
        raise ValueError(
            f"global_batch_size={global_batch_size} does not divide evenly over {replicas} "
            f"replicas. Received: global_batch_size={global_batch_size}. Use a multiple of "
            f"{replicas}, such as {global_batch_size // replicas * replicas or replicas} or "
            f"{(global_batch_size // replicas + 1) * replicas}."
        )
    return int(global_batch_size) // replicas


def shard(
    data,
    strategy: tf.distribute.Strategy,
    *,
    global_batch_size: int,
    shuffle: bool = False,
    seed: int | None = None,
    drop_remainder: bool = False,
    pad_remainder: bool = True,
    shuffle_buffer: int | None = None,
    augment=None,
) -> tf.distribute.DistributedDataset:
    """Splits data into per-replica batches: every example once, no replica empty.

    Each step takes the next `global_batch_size` examples; replica `k` gets the `k`-th
    slice of `global_batch_size / replicas`. Elements are `(x, y, sample_weight)` (the
    weight appended, or multiplied into a weight you pass), or `x` for data without
    labels. Use the result in `model.fit()`/`evaluate()` or in a custom loop
    (`for batch in ds: strategy.run(step, args=(batch,))`).

    The final partial batch, by default, is padded to a full global batch with copies
    of real examples of `sample_weight` -0.0 (negative zero: nothing in a loss, and told
    apart from real examples weighed 0). Its `r` real examples are spread in order over
    the replicas (`r // N` or `r // N + 1` each; with `r < N` the last replicas get
    copies only, never an empty batch), and they weigh `global_batch_size / r`. Then,
    with a loss reduced by `"sum_over_batch_size"` (the Keras default) or
    `tf.nn.compute_average_loss(..., sample_weight=w, global_batch_size=B)`, the loss
    and the gradients equal those of one device on the same batches, and Keras's
    `loss`, `metrics` and `weighted_metrics` (with the weights you passed) count the
    real examples only, as one device (`strategykit.upstream.exact_metrics`); so do
    synchronized batch norm's moments and moving statistics (`sk.SyncBatchNormalization`
    and Keras's `synchronized=True`) and activity regularizers, in `fit()` and
    `evaluate()` (`strategykit.batches`). What still sees the copies: unsynchronized
    batch norm (each replica's own moments) and a term a layer adds with `add_loss`
    (`sk.check` names the layer); there, prefer `drop_remainder=True`.

    With one replica (one device, or `tf.distribute.get_strategy()` outside any strategy
    to get the same examples in the same order there) nothing is padded: the final
    batch is the remainder, as Keras batches numpy data, and every number Keras
    reports is its own.

    `pad_remainder=False` pads nothing: the final batch is spread as evenly as possible
    over the replicas (a remainder smaller than the number of replicas joins the batch
    before it, when the size of the data is known), so no replica runs an empty batch.
    Evaluation is exact either way. Do not train that way: replicas of unequal size
    are averaged with equal weight.

    Data without labels (an array, a dict, a 1-tuple) gets no weights. `model.predict`
    of the result returns one row per example, in the order of `data` (also when
    shuffled), as one device's `model.predict(x, batch_size=global_batch_size)`:
    padded copies are left out, with or without `pad_remainder`
    (`strategykit.data.predict_input`, which lists what it refuses).

    `fit(ds, class_weight=...)` multiplies each real example's weight by its class's
    before the batch is padded (copies stay -0.0): N replicas train as one device with
    `class_weight` (`strategykit.upstream.class_weights`).

    With several workers, numpy and `tf.data` inputs are sharded by data (policy
    `DATA`, set explicitly: no AUTO-sharding warnings), every worker getting its
    replicas' slices of each padded global batch. `fn(input_context)` must read its own
    part (by files, as `sk.shard_tfds` does); each pipeline then pads its own final
    batch, weighted by its own count: exact only when the pipelines hold equally many
    examples of the final step, and a pipeline that runs out a step early leaves its
    replicas empty. Across workers with `fn`, prefer `drop_remainder=True`.

    Args:
        data: numpy arrays, a tuple `(x, y)` / `(x, y, sample_weight)` or dict of
            arrays, an unbatched `tf.data.Dataset`, or a function
            `fn(input_context) -> tf.data.Dataset` of unbatched examples. Several
            inputs as Keras takes them: `([x1, x2], y)` (a list of arrays, read as a
            tuple), `((x1, x2), y)` or `({"a": x1, "b": x2}, y)`.
        strategy: the `tf.distribute.Strategy`.
        global_batch_size: examples per step over all replicas; a multiple of them.
        shuffle: reshuffle the examples every epoch. Default False.
            With a `seed`, epoch `e` of `fit()` is ordered by `(seed, e)` alone (and so
            are the seeds of `augment`): a run resumed by
            `sk.callbacks.BackupAndRestore` sees the orders of an uninterrupted one.
        seed: shuffle seed; the same seed gives the same orders. Default None (random,
            a new order every pass); required with `shuffle=True` across several
            workers (one seed for all).
        drop_remainder: drop the final partial batch. Default False.
        pad_remainder: pad the final partial batch (above) rather than split it
            unevenly. Default True.
        shuffle_buffer: shuffle buffer size. Default: the whole dataset when its size
            is known; required for data of unknown size.
        augment: a function `(example, seed) -> example` run on every example before
            batching, where `seed` is a shape-[2] int64 tensor for stateless random ops
            (`tf.image.stateless_random_flip_left_right(x, seed)`, ...). Each example,
            hence each replica, gets its own seed, new every epoch and reproducible from
            `seed` (and the input pipeline). Default None.

    Returns:
        A `tf.distribute.DistributedDataset`.

    Warns:
        UserWarning: a padded `global_batch_size` more than twice the data's size (rounded
            up to a multiple of the replicas): its one step is mostly padded copies.

    Raises:
        ValueError: a batch size that does not divide over the replicas, or of 2**31 or
            more (one larger than the data is warned of, above); a `seed` that is
            not an int from 0 to 2**32 - 1 or a `shuffle_buffer` not a positive int;
            data that is already batched, of windows (`.window()`) or ragged tensors, of
            unequal lengths or examples of different shapes, empty (`{}`, `()`, zero
            examples), or of an unsupported type (a model, say); a function that takes no
            `input_context`; an `augment` that is not a function, a `strategy` that is
            not one, or `shuffle=True` without a seed across several workers.

    Example:
        >>> import numpy as np, strategykit as sk
        >>> strategy = sk.mirrored(replicas=2)  # doctest: +SKIP
        >>> ids = np.arange(10)
        >>> ds = sk.shard((ids, ids), strategy, global_batch_size=4)  # doctest: +SKIP
        >>> sk.replica_batches(ds, strategy)  # doctest: +SKIP
        [[[0, 1], [2, 3]], [[4, 5], [6, 7]], [[8], [9]]]
    """
    per_replica_batch_size(strategy, global_batch_size)
    check_seed(seed)
    check_shuffle_buffer(shuffle_buffer)
    if augment is not None and not callable(augment):
        raise ValueError(
            "augment must be a function, run on every example before batching. Received: "
            f"augment={augment!r}. Pass a function (example, seed) -> example, e.g. "
            "augment=lambda example, seed: (tf.image.stateless_random_flip_left_right("
            "example[0], seed), example[1]), or None.")
    upstream.install()  # Keras then counts only the real examples of a padded batch
    strategies.register(strategy)  # and its fixes apply to this strategy's models
    remainder = "drop" if drop_remainder else ("pad" if pad_remainder else "split")
    if remainder == "pad" and strategy.num_replicas_in_sync == 1:
        remainder = "split"  # one replica takes the final partial batch as it is
    source, size = examples_source(data)
    if size is not None:
        check_size(size, global_batch_size, remainder, strategy.num_replicas_in_sync)
    if shuffle and seed is None and not callable(data) and is_multi_worker(strategy):
        raise ValueError(
            "shuffle=True across several workers needs a seed: every worker reads the "
            "same examples and keeps its replicas' slices, so all must shuffle them into "
            "the same order. Received: seed=None. Pass seed=<an int>, the same on every "
            "worker (it still reshuffles every epoch)."
        )
    if shuffle and shuffle_buffer is None and size is None:
        raise ValueError(
            "shuffle=True needs a shuffle buffer, and the size of this data is unknown. "
            "Received: shuffle_buffer=None. Pass shuffle_buffer=<number of examples> (or "
            "less, for a partial shuffle)."
        )

    steps: list = []  # each pipeline's step count, when known
    specs: list = []  # each pipeline's element spec
    pipeline = functools.partial(
        make_pipeline, global_batch_size=global_batch_size, remainder=remainder,
        shuffle=shuffle, seed=seed, shuffle_buffer=shuffle_buffer or size,
        replicas=strategy.num_replicas_in_sync, augment=augment, steps=steps, specs=specs,
    )

    def distribute(continuous: bool = False, indexed: bool = False, **options):
        """A distributed dataset of the data (each epoch's, predict()'s), registered as
        strategykit's: the fixes of `strategykit.upstream` act on it."""
        build = functools.partial(pipeline, continuous=continuous, **options)
        if indexed:  # predict()'s data: fit()'s steps and specs are not its
            build = functools.partial(build, indexed=True, steps=None, specs=None)
        if callable(data):
            distributed = strategy.distribute_datasets_from_function(
                lambda context: build(source(context), context=context))
        elif remainder == "split":
            # Uneven per-replica batches need per-replica pipelines: cut by `split_evenly`.
            distributed = strategy.distribute_datasets_from_function(
                lambda context: build(source(None), size, context=context, every_replica=True))
        else:
            distributed = strategy.experimental_distribute_dataset(build(source(None)))
        model_scope.register(distributed, strategy)
        return distributed

    def made(**options):
        """The distributed dataset, made with the batch `options` of `make_pipeline`:
        `class_weights` (Keras's `class_weight`, `upstream.class_weights`) and
        `preprocess` (keras-hub's preprocessor, `upstream.keras_hub_pipelines`)."""
        known_steps, known_specs = len(steps), len(specs)
        distributed = distribute(**options)
        own_steps, own_specs = steps[known_steps:], specs[known_specs:]
        if options.get("class_weights") is not None:
            _check_labels(options["class_weights"], own_specs)
        keyed_by_epoch = seed is not None and (shuffle or augment is not None)
        if own_steps:
            state_steps(distributed, own_steps[0])
            if not is_multi_worker(strategy):
                attach_stream(distributed, EpochStream(
                    lambda: distribute(continuous=True, **options),
                    own_steps[0], element_spec=own_specs[0], keyed_by_epoch=keyed_by_epoch))
        elif not is_multi_worker(strategy):  # of unknown size: each epoch read to its end
            attach_stream(distributed, PassEachEpoch(lambda: distribute(**options),
                                                     element_spec=own_specs[0]))
        _GLOBAL_BATCH[distributed] = int(global_batch_size)
        if shuffle and seed is None:
            note_new_order_every_pass(
                distributed, "is shuffled without a seed: every pass draws a new order",
                "pass sk.shard(..., shuffle=True, seed=<an int>) (it still reshuffles every "
                "epoch)")
        remade_data.register(distributed, lambda **changes: made(**{**options, **changes}),
                             options)
        predict_input.register(
            distributed, functools.partial(distribute, indexed=True,
                                           preprocess=options.get("preprocess")), strategy,
            from_function=callable(data), steps=own_steps[0] if own_steps else None,
            shuffle=shuffle, drop_remainder=drop_remainder, keyed_by_epoch=keyed_by_epoch)
        return distributed

    return made()


def _check_labels(class_weights, specs) -> None:
    """`fit(class_weight=...)` needs data of labels; raises ValueError on features only."""
    if specs and split_labels(specs[-1])[1] is None:
        raise ValueError(
            "class_weight needs labels, and this sk.shard data holds features only. "
            f"Received: class_weight={class_weights.class_weight} "
            f"and data of element_spec={specs[-1]}. Pass (x, y) to sk.shard, or fit "
            "without class_weight."
        )
