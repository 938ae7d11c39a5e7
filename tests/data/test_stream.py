"""One input pipeline for many epochs (`strategykit.data.stream`): every epoch read from
one iterator sees exactly the examples, in the order and with the padding, that a pass
of its own (`for batch in dataset`, what Keras read before) gives that epoch."""

import numpy as np
import pytest

import strategykit as sk
from strategykit.data import position
from strategykit.data.stream import PassEachEpoch, stream_of

IDS = np.arange(10)  # 2 replicas, global batch 4: steps of 4, 4 and 2 (padded) examples


def _replica_values(element, strategy):
    first = element[0] if isinstance(element, tuple) else element
    return [np.asarray(v).tolist() for v in strategy.experimental_local_results(first)]


def _read_epoch(ds, strategy, epoch):
    for _, batches in sk.epochs(ds, epoch + 1, initial_epoch=epoch):
        return [_replica_values(batch, strategy) for batch in batches]


def _shard_with_passes(strategy, epochs, **options):
    """`sk.shard` of IDS, and each epoch's own pass (`for batch in ds`), padding shown."""
    ds = sk.shard((IDS, IDS), strategy, global_batch_size=4, **options)
    return ds, [sk.replica_batches(ds, strategy, epoch=epoch, padding=True)
                for epoch in range(epochs)]


@pytest.mark.parametrize("options", [
    {"shuffle": True, "seed": 3},
    {"shuffle": True, "seed": 3, "pad_remainder": False},
    {"augment": lambda example, seed: example, "seed": 5},
    {},
])
def test_each_epoch_of_the_stream_is_that_epochs_own_pass(make_strategy, options):
    strategy = make_strategy(2)
    ds, expected = _shard_with_passes(strategy, 3, **options)
    assert [_read_epoch(ds, strategy, epoch) for epoch in range(3)] == expected
    assert stream_of(ds).iterators_made == 1
    if options.get("shuffle"):
        assert expected[0] != expected[1]  # the epochs differ, so the test can tell


def test_a_resumed_epoch_starts_after_its_steps_and_the_next_continues(make_strategy):
    strategy = make_strategy(2)
    ds, expected = _shard_with_passes(strategy, 3, shuffle=True, seed=1)
    position.skip_steps(1)
    assert _read_epoch(ds, strategy, 1) == expected[1][1:]
    assert _read_epoch(ds, strategy, 2) == expected[2]
    assert stream_of(ds).iterators_made == 1


def test_another_epoch_or_a_broken_off_one_starts_a_new_iterator(make_strategy):
    strategy = make_strategy(2)
    ds, expected = _shard_with_passes(strategy, 2, shuffle=True, seed=1)
    stream = stream_of(ds)
    assert _read_epoch(ds, strategy, 0) == expected[0]
    assert _read_epoch(ds, strategy, 0) == expected[0]  # a new fit() from epoch 0
    assert stream.iterators_made == 2
    position.set_epoch(1)
    iterator, _, token = stream.open_epoch()
    next(iterator)
    stream.close_epoch(token, completed=False)  # stopped after one step
    assert _read_epoch(ds, strategy, 1) == expected[1]
    assert stream.iterators_made == 3


def test_unordered_data_continues_across_fits_from_epoch_zero(make_strategy):
    strategy = make_strategy(2)
    ds, (expected,) = _shard_with_passes(strategy, 1)
    for epoch in (0, 1, 0):
        assert _read_epoch(ds, strategy, epoch) == expected
    assert stream_of(ds).iterators_made == 1


def test_an_epoch_opened_since_is_not_closed_by_a_stale_token(make_strategy):
    strategy = make_strategy(2)
    stream = stream_of(sk.shard((IDS, IDS), strategy, global_batch_size=4))
    _, steps, old = stream.open_epoch()
    iterator, _, new = stream.open_epoch()  # a new fit() while the old epoch was left open
    for _ in range(steps):
        next(iterator)
    stream.close_epoch(old, completed=False)  # the old epoch's end, seen late: ignored
    stream.close_epoch(new, completed=True)
    assert stream.open_epoch()[0] is iterator
    assert stream.iterators_made == 2


def test_data_of_unknown_size_is_read_to_its_end_each_epoch(make_strategy):
    import tensorflow as tf

    strategy = make_strategy(2)
    unknown = tf.data.Dataset.range(10).filter(lambda i: i < 8)
    stream = stream_of(sk.shard(unknown, strategy, global_batch_size=4))
    assert isinstance(stream, PassEachEpoch) and stream.steps is None
    assert stream_of(sk.shard((IDS, IDS), strategy, global_batch_size=4)).steps == 3


def test_a_custom_loop_reads_every_epoch_from_one_iterator(make_strategy):
    strategy = make_strategy(2)
    ds, expected = _shard_with_passes(strategy, 3, shuffle=True, seed=2)
    got = [[_replica_values(batch, strategy) for batch in batches]
           for _, batches in sk.epochs(ds, epochs=3, initial_epoch=1)]
    assert got == expected[1:] and stream_of(ds).iterators_made == 1
