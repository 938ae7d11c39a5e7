"""One iterator for many epochs: how Keras's epoch iterator reads distributed data.

Keras's `TFEpochIterator` (`keras/src/trainers/epoch_iterator.py`), when `fit()` has no
`steps_per_epoch`, makes a new iterator of the dataset at the start of every epoch, and,
when it knows the number of steps, another at the end of every epoch, which the next
epoch throws away. Under several replicas an iterator of a distributed dataset costs 0.2
to 0.5 s to start (more than a small model's epoch) and blocks the thread that deletes
it for up to a minute (`strategykit.upstream.iterator_reaper`). Upstream,
tensorflow/tensorflow#67677 proposed keeping the first iterator (closed unmerged, sent to
keras-team/keras); checked on Keras 3.15.1. The fix replaces
`TFEpochIterator._enumerate_iterator`, which yields each execution's `(first step, last
step, iterator)`:

* **`sk.shard` data** (registered here with `register` by `strategykit.data.stream`,
  and read without `steps_per_epoch`): each epoch is the `source`'s `open_epoch()`, the
  iterator of one long-lived pipeline at the start of the epoch's pass with the pass's
  steps, read for exactly those steps and closed with `close_epoch(token, completed)`.
  The model is built from `source.example_batch()` (`multi_worker`'s
  `_maybe_symbolic_build` asks `example_batch_of`), so building reads no example.
* **Other data under several replicas of one worker, of a known number of steps,
  without `steps_per_epoch`**: one iterator per epoch, not two, and released on the
  reaper's thread when the epoch ends.
* Everything else (one replica, several workers, `steps_per_epoch`, an unknown number
  of steps) goes to Keras's own code.

Each execution is `steps_per_execution.execution(...)`: of at most `steps_per_execution`
steps and never past the epoch's end, and the last step Keras reports is the last run.
"""

from __future__ import annotations

import weakref

from strategykit.cluster.roles import is_multi_worker
from strategykit.upstream import iterator_reaper, steps_per_execution
from strategykit.upstream.fix import CHECKED_ON, Fix, original, resolve

_EPOCH_ITERATOR = "keras.src.backend.tensorflow.trainer:TFEpochIterator"
_SOURCES = weakref.WeakKeyDictionary()


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


def _enumerate_iterator(self):
    if self.steps_per_epoch is None:
        source = source_of(self._distributed_dataset)
        if source is not None:
            return _epoch_of_source(self, source)
        strategy = self._distribute_strategy
        if (self._num_batches and strategy.num_replicas_in_sync > 1
                and not is_multi_worker(strategy)):
            return _epoch_of_new_iterator(self)
    return original(resolve(_EPOCH_ITERATOR), "_enumerate_iterator")(self)


def _epoch_of_source(self, source):
    self.data_adapter.on_epoch_begin()
    iterator, steps, token = source.open_epoch()
    completed = False
    try:
        yield from _executions(self, iterator, steps)
        completed = True
    finally:
        source.close_epoch(token, completed)
    self.data_adapter.on_epoch_end()


def _epoch_of_new_iterator(self):
    self.data_adapter.on_epoch_begin()
    iterator = iter(self._get_iterator())
    try:
        yield from _executions(self, iterator, self._num_batches)
    finally:
        iterator_reaper.release(iterator)
        del iterator
    self.data_adapter.on_epoch_end()


def _executions(self, iterator, steps: int):
    per_execution = self.steps_per_execution
    for first in range(0, steps, per_execution):
        count = min(per_execution, steps - first)
        self._steps_seen = first + count
        yield first, first + count - 1, steps_per_execution.execution(
            iterator, count, per_execution)


FIXES = (
    Fix(
        issue="tensorflow/tensorflow#67677",
        checked_on=CHECKED_ON,
        owner=_EPOCH_ITERATOR,
        attribute="_enumerate_iterator",
        replacement=_enumerate_iterator,
        relies_on={
            # replaced where it applies: a new iterator each epoch (and one more at its end)
            "keras.src.trainers.epoch_iterator:EpochIterator._enumerate_iterator":
                "376e3e16a928107a",
            # what the trainer reads of each yielded execution, and how it stops
            "keras.src.trainers.epoch_iterator:EpochIterator.catch_stop_iteration":
                "494549649577e596",
            f"{_EPOCH_ITERATOR}.__init__": "901af2700297156f",
        },
    ),
)
