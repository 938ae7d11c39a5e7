"""One iterator for many epochs: how Keras's epoch iterator reads distributed data.

Keras's `TFEpochIterator` (`keras/src/trainers/epoch_iterator.py`), when `fit()` has no
`steps_per_epoch`, makes a new iterator of the dataset at the start of every epoch, and,
when it knows the number of steps, another at the end of every epoch, which the next
epoch throws away. Under several replicas an iterator of a distributed dataset costs 0.2
to 0.5 s to start (more than a small model's epoch) and blocks the thread that deletes
it for up to a minute (`strategykit.background.iterator_reaper`). Upstream,
tensorflow/tensorflow#67677 proposed keeping the first iterator (closed unmerged, sent to
keras-team/keras); checked on Keras 3.8.0 to 3.15.1. The fix replaces
`TFEpochIterator._enumerate_iterator`, which yields each execution's `(first step, last
step, iterator)`:

* **`sk.shard` data** (registered here with `register` by `strategykit.data.stream`,
  and read without `steps_per_epoch`): each epoch is the `source`'s `open_epoch()`, the
  iterator of one long-lived pipeline at the start of the epoch's pass with the pass's
  steps, read for exactly those steps and closed with `close_epoch(token, completed)`.
  Data of unknown size has no steps (None): each batch is read before its step, and the
  epoch ends where there is none (Keras's extra step would count on the optimizer).
  The model is built from `source.example_batch()` (`multi_worker`'s
  `_maybe_symbolic_build` asks `example_batch_of`), so building reads no example.
* **Other data under several replicas of one worker of a strategy strategykit made or
  sharded for (`strategykit.made.strategies`), of a known number of steps,
  without `steps_per_epoch`**: one iterator per epoch, not two, released to the
  reaper's thread when the next epoch starts or the call ends.
* Everything else (one replica, several workers, `steps_per_epoch`, an unknown number
  of steps, a strategy strategykit did not make) goes to Keras's own code. Under
  several replicas of one worker of a strategy of strategykit's, the iterators Keras
  makes there are deleted on the reaper's thread too: each when Keras starts the next,
  the last when Keras's epoch iterator is deleted (at the end of the call, or at a
  later garbage collection, which then waits for nothing).

Each execution is `steps_per_execution.execution(...)`: of at most `steps_per_execution`
steps and never past the epoch's end, and the last step Keras reports is the last run.
"""

from __future__ import annotations

import weakref

from strategykit.background import iterator_reaper
from strategykit.cluster.roles import is_multi_worker
from strategykit.made import strategies
from strategykit.pinning.fix import Fix, by_fingerprint, original, resolve
from strategykit.upstream import steps_per_execution

_EPOCH_ITERATOR = "keras.src.backend.tensorflow.trainer:TFEpochIterator"
_SOURCES = weakref.WeakKeyDictionary()
_KERAS_ITERATORS = weakref.WeakKeyDictionary()  # a Keras epoch iterator: its _Reading


def register(distributed, source) -> None:
    """Makes Keras read the epochs of `distributed` from `source`.

    Args:
        distributed: a distributed dataset.
        source: an object with `open_epoch() -> (iterator, steps, token)`,
            `close_epoch(token, completed)` and `example_batch()`
            (`strategykit.data.stream.EpochStream`).
    """
    _SOURCES[distributed] = source


def source_of(distributed):
    """The source registered for `distributed`, or None."""
    try:
        return _SOURCES.get(distributed)
    except TypeError:  # not weakly referenceable
        return None


def example_batch_of(epoch_iterator):
    """A batch shaped as the data of a Keras epoch iterator over a registered dataset (to
    build the model from), or None for other data."""
    source = source_of(getattr(epoch_iterator, "_distributed_dataset", None))
    return None if source is None else source.example_batch()


def _reads_a_source(epoch_iterator) -> bool:
    """Where the fix is needed: `sk.shard` data read without `steps_per_epoch` (each
    epoch must start where training is). Elsewhere it only saves time."""
    return (epoch_iterator.steps_per_epoch is None
            and source_of(epoch_iterator._distributed_dataset) is not None)


def _enumerate_iterator(self):
    strategy = self._distribute_strategy
    several_replicas = (strategies.is_ours(strategy) and strategy.num_replicas_in_sync > 1
                        and not is_multi_worker(strategy))
    if self.steps_per_epoch is None:
        source = source_of(self._distributed_dataset)
        if source is not None:
            return _epoch_of_source(self, source)
        if self._num_batches and several_replicas:
            return _epoch_of_new_iterator(self)
    keras_epoch = original(resolve(_EPOCH_ITERATOR), "_enumerate_iterator")(self)
    return _releasing_keras_iterators(self, keras_epoch) if several_replicas else keras_epoch


def _releasing_keras_iterators(self, keras_epoch):
    """Keras's own epoch; the reaper gets each iterator it reads when Keras starts the
    next one (dropping this one), and the last when the epoch iterator is deleted."""
    reading = _reading(self)
    for execution in keras_epoch:
        reading.read(execution[-1])  # (first, [last,] iterator): see yields_last_step
        yield execution


def _reading(epoch_iterator) -> _Reading:
    """The `_Reading` of a Keras epoch iterator, made at its first epoch."""
    reading = _KERAS_ITERATORS.get(epoch_iterator)
    if reading is None:
        reading = _KERAS_ITERATORS[epoch_iterator] = _Reading()
        weakref.finalize(epoch_iterator, reading.release).atexit = False
    return reading


class _Reading:
    """The iterator a Keras epoch iterator reads now, held so that it is deleted on the
    reaper's thread rather than where Keras drops it."""

    def __init__(self):
        self.iterator = None

    def read(self, iterator) -> None:
        if iterator is not self.iterator:
            self.release()
            self.iterator = iterator

    def release(self) -> None:
        if self.iterator is not None:
            iterator_reaper.release(self.iterator)
            self.iterator = None


def _epoch_of_source(self, source):
    self.data_adapter.on_epoch_begin()
    iterator, steps, token = source.open_epoch()
    completed = False
    try:
        if steps is None:
            yield from _executions_until_end(self, iterator)
        else:
            yield from _executions(self, iterator, steps)
        completed = True
    finally:
        source.close_epoch(token, completed)
    self.data_adapter.on_epoch_end()


def _epoch_of_new_iterator(self):
    self.data_adapter.on_epoch_begin()
    iterator = iter(self._get_iterator())
    _reading(self).read(iterator)  # to the reaper when the next starts or self is deleted
    yield from _executions(self, iterator, self._num_batches)
    self.data_adapter.on_epoch_end()


def _executions(self, iterator, steps: int):
    per_execution = self.steps_per_execution
    with_last = by_fingerprint(_KERAS_ENUMERATE, _KERAS_YIELDS_LAST_STEP)
    for first in range(0, steps, per_execution):
        count = min(per_execution, steps - first)
        self._steps_seen = first + count
        execution = steps_per_execution.execution(iterator, count, per_execution)
        yield (first, first + count - 1, execution) if with_last else (first, execution)


def _executions_until_end(self, iterator):
    """The executions of an epoch of unknown length, each of the batches read before it
    (`steps_per_execution.Fetched`): the epoch ends where there is no next batch."""
    with_last, first = by_fingerprint(_KERAS_ENUMERATE, _KERAS_YIELDS_LAST_STEP), 0
    while True:
        batches = []
        while len(batches) < self.steps_per_execution:
            optional = iterator.get_next_as_optional()
            if not optional.has_value():
                break
            batches.append(optional.get_value())
        if not batches:
            return
        self._steps_seen = first + len(batches)
        last = self._steps_seen - 1
        execution = steps_per_execution.Fetched(batches)
        yield (first, last, execution) if with_last else (first, execution)
        if len(batches) < self.steps_per_execution:
            return
        first = last + 1


_KERAS_ENUMERATE = "keras.src.trainers.epoch_iterator:EpochIterator._enumerate_iterator"
# What Keras's own epoch yields for each execution, by the fingerprint of its code: the
# trainers unpack the same (and report the first step of an execution to callbacks up
# to Keras 3.10, its last one later).
_KERAS_YIELDS_LAST_STEP = {
    "5b12fbb1202bfd36": False,  # Keras 3.8.0 to 3.10.0: (first step, iterator)
    "376e3e16a928107a": True,  # Keras 3.11.0 to 3.15.1: (first step, last step, iterator)
}


def yields_last_step() -> bool:
    """Whether Keras's epochs yield `(first, last, iterator)` (Keras 3.11 and later) or
    `(first, iterator)`; callbacks get an execution's last or first step accordingly."""
    return by_fingerprint(_KERAS_ENUMERATE, _KERAS_YIELDS_LAST_STEP)


FIXES = (
    Fix(
        issue="tensorflow/tensorflow#67677",
        affects="fit() and evaluate() of sk.shard data",
        owner=_EPOCH_ITERATOR,
        attribute="_enumerate_iterator",
        replacement=_enumerate_iterator,
        refuses_when=_reads_a_source,
        relies_on={
            # replaced where it applies: a new iterator each epoch (and one more at its end)
            _KERAS_ENUMERATE: tuple(_KERAS_YIELDS_LAST_STEP),
            # what the trainer reads of each yielded execution, and how it stops
            "keras.src.trainers.epoch_iterator:EpochIterator.catch_stop_iteration":
                "494549649577e596",
            f"{_EPOCH_ITERATOR}.__init__": "901af2700297156f",
        },
    ),
)
