"""One input pipeline for many epochs: the iterator Keras keeps over `sk.shard` data.

Keras makes a new iterator of a distributed dataset every epoch of `fit()` (and every
`evaluate()`), and under several replicas each costs more than an epoch of a small
model's steps to start, and blocks when it is deleted. `sk.shard` knows what Keras does
not: the steps of every pass, and which epoch orders it. So each `sk.shard` dataset
gets an `EpochStream`: one iterator over a *continuous* copy of its pipeline (every
epoch's pass after the other, `position.positioned(..., continuous=True)`), which
`strategykit.upstream.epoch_input` hands to Keras epoch after epoch.

An epoch continues the iterator when it is the one the iterator has reached: the
previous epoch took every step of its pass, no resumed run asks to skip steps, and,
when the order depends on the epoch (a `seed` with `shuffle` or `augment`), the epoch
is the next. Otherwise (the first epoch, another `fit()` from epoch 0, an epoch broken
off) the stream starts a new iterator at the training position, and the old one is
released on a thread of its own (`upstream.iterator_reaper`). Each epoch sees the
examples it sees through `for batch in dataset`, in the same order.
"""

from __future__ import annotations

import numbers
import threading
import weakref

import tensorflow as tf

from strategykit.background import iterator_reaper
from strategykit.data import position
from strategykit.upstream import epoch_input
from strategykit.upstream.steps_per_execution import Steps


class EpochStream:
    """The epochs of one `sk.shard` dataset, read from one long-lived iterator.

    Args:
        make_continuous: a function of no arguments returning the continuous distributed
            dataset (made when the first epoch is read).
        steps: the steps of a whole pass (an epoch).
        keyed_by_epoch: whether the order of a pass depends on its epoch.
        element_spec: the per-step element's spec (shapes and dtypes), for
            `example_batch`; None for data no model is built from (`predict()`'s).
        resumes: an epoch leaves out the steps a resumed run skips (default); False:
            every epoch is whole, and the skip is left to `fit()` (`predict()`'s data).

    Example:
        >>> import numpy as np, strategykit as sk  # doctest: +SKIP
        >>> strategy = sk.mirrored(replicas=2)  # doctest: +SKIP
        >>> ds = sk.shard(np.arange(10.0), strategy, global_batch_size=4)  # doctest: +SKIP
        >>> stream = stream_of(ds)  # doctest: +SKIP
        >>> iterator, steps, token = stream.open_epoch()  # doctest: +SKIP
        >>> steps  # doctest: +SKIP
        3
    """

    def __init__(self, make_continuous, steps: int, *, keyed_by_epoch: bool, element_spec,
                 resumes: bool = True):
        self._make_continuous = make_continuous
        self._continuous = None
        self.steps = int(steps)
        self.keyed_by_epoch = keyed_by_epoch
        self.element_spec = element_spec
        self.resumes = resumes
        self.iterators_made = 0
        self._lock = threading.Lock()
        self._iterator = None
        self._next_epoch = None  # the epoch whose pass the iterator starts next
        self._open = False  # an epoch was opened and not closed after all its steps
        self._token = 0  # names the epoch last opened

    def open_epoch(self) -> tuple:
        """The iterator at the start of the current epoch's pass, its steps, and a token
        for `close_epoch`.

        The steps are the pass's, less those a resumed run skips.
        """
        epoch, skip = position.current_epoch(), position.pending_skip() if self.resumes else 0
        with self._lock:
            if not self._continues(epoch, skip):
                self._start()
            self._token += 1
            self._open, self._next_epoch = True, epoch
            return self._iterator, self.steps - skip, self._token

    def close_epoch(self, token: int, completed: bool) -> None:
        """Ends the epoch `token` names: all its steps were read (`completed`), or it was
        broken off (the iterator is then mid-pass: the next epoch starts a new one). An
        epoch opened since then is left alone."""
        with self._lock:
            if token != self._token or not self._open:
                return
            if completed:
                self._open, self._next_epoch = False, self._next_epoch + 1
            else:
                self._retire()

    def example_batch(self):
        """A batch of zeros shaped as one replica's batch (for building a model), or None
        where a shape is unknown beyond the batch (sequences of any length): the model is
        then built from a batch read, as Keras builds it."""
        specs = tf.nest.flatten(self.element_spec)
        if any(spec.shape.rank is None or not spec.shape[1:].is_fully_defined()
               for spec in specs):
            return None
        return tf.nest.map_structure(
            lambda spec: tf.zeros([d if d is not None else 1 for d in spec.shape], spec.dtype),
            self.element_spec)

    def release(self) -> None:
        """Lets go of the iterator (on the reaper's thread)."""
        with self._lock:
            self._retire()

    def _continues(self, epoch: int, skip: int) -> bool:
        return (self._iterator is not None and not self._open and skip == 0
                and (not self.keyed_by_epoch or epoch == self._next_epoch))

    def _start(self) -> None:
        self._retire()
        if self._continuous is None:
            self._continuous = self._make_continuous()
        self._iterator = iter(self._continuous)
        self.iterators_made += 1

    def _retire(self) -> None:
        if self._iterator is not None:
            iterator_reaper.release(self._iterator)
        self._iterator, self._open = None, False


class PassEachEpoch:
    """The epochs of an `sk.shard` dataset of unknown size: a new iterator each epoch,
    read to its end (no steps: `strategykit.upstream.epoch_input` reads each batch
    before its step, and no step runs past the end).

    Args:
        make_one_pass: a function of no arguments returning the distributed dataset of
            one pass (made when the first epoch is read).
        element_spec: the per-step element's spec, for `example_batch`.
    """

    steps = None

    def __init__(self, make_one_pass, *, element_spec):
        self._make_one_pass = make_one_pass
        self._one_pass = None
        self.element_spec = element_spec
        self.iterators_made = 0
        self._lock = threading.Lock()
        self._iterator = None
        self._token = 0

    def open_epoch(self) -> tuple:
        """A new iterator at the start of the current epoch's pass, None steps, a token."""
        with self._lock:
            self._retire()
            if self._one_pass is None:
                self._one_pass = self._make_one_pass()
            self._iterator = iter(self._one_pass)
            self.iterators_made += 1
            self._token += 1
            return self._iterator, None, self._token

    def close_epoch(self, token: int, completed: bool) -> None:
        """Lets go of the epoch's iterator (read to its end, or broken off)."""
        with self._lock:
            if token == self._token:
                self._retire()

    example_batch = EpochStream.example_batch

    def release(self) -> None:
        """Lets go of the iterator (on the reaper's thread)."""
        with self._lock:
            self._retire()

    def _retire(self) -> None:
        if self._iterator is not None:
            iterator_reaper.release(self._iterator)
        self._iterator = None


def attach_stream(distributed, stream: EpochStream | PassEachEpoch) -> None:
    """Makes Keras read `distributed` through `stream`; the stream's iterator is released
    (off the caller's thread) when `distributed` is."""
    epoch_input.register(distributed, stream)
    weakref.finalize(distributed, stream.release)


def stream_of(distributed) -> EpochStream | None:
    """The stream of an `sk.shard` dataset, or None."""
    return epoch_input.source_of(distributed)


def epochs(dataset, epochs: int, *, initial_epoch: int = 0):
    """Each epoch's batches of an `sk.shard` dataset, all from one iterator.

    `for batch in dataset` starts a new iterator each time: under several replicas that
    costs more than a small model's epoch, every epoch. In a custom training loop, read
    the epochs through `epochs` instead: epoch `e` gets exactly the batches (order,
    shuffle, padding) that `for batch in dataset` gives it in epoch `e` of `fit()`.
    An epoch left before its last batch is no loss: the next one starts a new iterator.

    Args:
        dataset: a dataset made by `sk.shard` or `sk.shard_tfds` (of a known size, one
            worker); other datasets get a new iterator per epoch, as `for` does.
        epochs: the epoch to stop before, as in `fit()`.
        initial_epoch: the first epoch. Default 0.

    Yields:
        `(epoch, batches)`: `batches` is an iterator of the epoch's batches (its
        `iterator` and `count` attributes serve a loop inside a `tf.function`).

    Example:
        >>> import numpy as np, strategykit as sk
        >>> strategy = sk.mirrored(replicas=2)  # doctest: +SKIP
        >>> ds = sk.shard(np.arange(8.0), strategy, global_batch_size=4)  # doctest: +SKIP
        >>> for epoch, batches in sk.epochs(ds, epochs=2):  # doctest: +SKIP
        ...     for batch in batches:
        ...         strategy.run(lambda x: x * 2, args=(batch,))
    """
    for name, value in (("epochs", epochs), ("initial_epoch", initial_epoch)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
            raise ValueError(
                f"{name} must be an int >= 0, as in fit(). Received: {name}={value!r}. "
                f"Pass e.g. {name}={3 if name == 'epochs' else 0}.")
    stream = stream_of(dataset)
    for epoch in range(initial_epoch, epochs):
        position.set_epoch(epoch)
        if stream is None or stream.steps is None:  # unknown size: to the end, as `for`
            yield epoch, iter(dataset)
            continue
        iterator, steps, token = stream.open_epoch()
        batches = Steps(iterator, steps)
        try:
            yield epoch, batches
        finally:  # also when the loop over the epochs is left early
            stream.close_epoch(token, completed=batches.left == 0)
