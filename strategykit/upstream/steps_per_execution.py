"""keras-team/keras#19246: `steps_per_execution` > 1 under several replicas.

Keras runs `steps_per_execution=K` steps in one call of a `tf.function`: a `tf.while_loop`
whose body takes the next batch as a `tf.experimental.Optional` and runs the step in a
`tf.cond` on whether it has a value, so that an epoch may end inside the loop. Under a
`MirroredStrategy` of several replicas, a step that all-reduces (synchronized batch norm,
`strategykit.upstream.exact_metrics`) fails there: `You must feed a value for placeholder
tensor 'while/cond/Placeholder'`. strategykit always knows how many steps an execution
runs (`strategykit.upstream.epoch_input` counts the steps of each epoch), so it needs no
Optional and no cond:

* `execution(iterator, count, K)` is what the epoch iterator hands Keras's step function
  for an execution of `count` steps: the iterator itself when K is 1 (Keras's code runs,
  unchanged), else `Steps(iterator, count)`.
* `TensorFlowTrainer._make_function` (which builds `train_function` and `test_function`)
  is replaced by one that runs a `Steps` in a `tf.function` of its own: the first step,
  then a `tf.while_loop` of the other `count - 1` (a tensor: traced once), each step
  Keras's `strategy.run(step) + reduce_per_replica(..., "auto")`. Anything else goes to
  the function Keras built.

Every step function Keras builds (K = 1 too) for a model of a strategy strategykit made
or sharded for (`strategykit.made.strategies`) runs its steps publishing their batch
(`strategykit.batches.current_step`), so the layers a step calls know which of its
examples are real; any other model's step is Keras's own (only `sk.shard`'s data, read
by `epoch_input`, ever hands it a `Steps`).
Where the model's `jit_compile` is on under several replicas, each replica's step is
compiled and Keras's function is built without whole-step XLA
(`strategykit.xla.replica_steps`, keras-team/keras#19005).

`Steps` is also a Python iterator of its `count` batches, so code that iterates it (as
Keras's `predict()` and its eager fallback do) reads exactly those.
"""

from __future__ import annotations

import contextlib

import tensorflow as tf

from strategykit.batches import current_step
from strategykit.made import strategies
from strategykit.pinning.fix import Fix, original, resolve
from strategykit.xla import replica_steps as xla_steps

ISSUE = "keras-team/keras#19246"
_TRAINER_MODULE = "keras.src.backend.tensorflow.trainer"
_TRAINER = f"{_TRAINER_MODULE}:TensorFlowTrainer"
_tracing = [0]  # > 0 while the steps of our own loop are traced (every replica's thread)


class Steps:
    """The next `count` batches of `iterator`: one execution of several steps.

    Example:
        >>> import tensorflow as tf
        >>> steps = Steps(iter(tf.data.Dataset.range(10)), 3)
        >>> [int(batch) for batch in steps]
        [0, 1, 2]
    """

    def __init__(self, iterator, count: int):
        self.iterator = iterator
        self.count = int(count)
        self._left = self.count

    def __iter__(self):
        return self

    def __next__(self):
        if self._left <= 0:
            raise StopIteration
        self._left -= 1
        return next(self.iterator)

    @property
    def left(self) -> int:
        """The batches not read yet."""
        return self._left

    def take_all(self):
        """The iterator and the steps left, marking them all read (by a traced loop)."""
        left, self._left = self._left, 0
        return self.iterator, left


class Fetched:
    """Batches read before their step: an execution of data of unknown size, whose epoch
    ends where there is no next batch (`epoch_input`), not with a step past the end.

    Example:
        >>> Fetched([1, 2]).batches
        [1, 2]
    """

    def __init__(self, batches: list):
        self.batches = list(batches)
        self._unread = iter(self.batches)

    def __iter__(self):
        return self

    def __next__(self):  # Keras's build reads a batch of what its epoch yields
        return next(self._unread)


def execution(iterator, count: int, steps_per_execution: int):
    """What the step function gets for an execution of `count` steps of `iterator`."""
    return iterator if steps_per_execution == 1 else Steps(iterator, count)


def in_own_loop() -> bool:
    """True while a step is traced inside this module's loop of several steps, where
    all-reduces work (`exact_metrics` asks)."""
    return _tracing[0] > 0


@contextlib.contextmanager
def _own_loop():
    _tracing[0] += 1
    try:
        yield
    finally:
        _tracing[0] -= 1


def _several_steps_on_several_replicas(model, step_function) -> bool:
    strategy = model.distribute_strategy
    return (model.steps_per_execution > 1 and strategies.is_ours(strategy)
            and strategy.num_replicas_in_sync > 1)


def _make_function(self, step_function):
    if strategies.is_ours(self.distribute_strategy):
        step_function = current_step.publishing(step_function)  # every step, K == 1 too
    if xla_steps.compiles_each_replica(self):
        step_function = xla_steps.compiling_each_replica(step_function)
    with xla_steps.building_without_whole_step_xla(self):
        keras_function = original(resolve(_TRAINER), "_make_function")(self, step_function)
    run_steps = run_one_step = None

    def function(iterator):
        nonlocal run_steps, run_one_step
        if isinstance(iterator, Fetched):
            run_one_step = run_one_step or _one_step(self, step_function)
            for data in iterator.batches:
                outputs = run_one_step(data)
            return outputs
        if not isinstance(iterator, Steps):
            return keras_function(iterator)
        if run_steps is None:
            run_steps = _steps_function(self, step_function)
        data, count = iterator.take_all()
        return run_steps(data, tf.constant(count, tf.int32))

    return function


def _one_step(model, step_function):
    """A function of a step's batch, Keras's `strategy.run(step)` and its reduction:
    traced (whole-step XLA where the model compiles so), eager with `run_eagerly`."""

    def one_step(data):
        strategy = model.distribute_strategy
        outputs = strategy.run(step_function, args=(data,))
        # Looked up at each call: strategykit.upstream.multi_worker replaces it.
        return resolve(_TRAINER_MODULE).reduce_per_replica(outputs, strategy, "auto")

    if model.run_eagerly:
        return one_step
    whole_step_xla = model.jit_compile and not xla_steps.compiles_each_replica(model)
    return tf.function(one_step, reduce_retracing=True, jit_compile=whole_step_xla)


def _steps_function(model, step_function):
    """A function `(iterator, count)` running `count` steps; returns the last logs."""
    one_step = _one_step(model, step_function)
    if model.run_eagerly:
        def run_steps(iterator, count):
            for _ in range(int(count)):
                outputs = one_step(next(iterator))
            return outputs

        return run_steps

    def run_steps(iterator, count):
        with _own_loop():
            outputs = one_step(next(iterator))
            _, outputs = tf.while_loop(
                lambda done, _: done < count,
                lambda done, _: (done + 1, one_step(next(iterator))),
                (tf.constant(1), outputs))
        return outputs

    return tf.function(run_steps, reduce_retracing=True)


KERAS_MAKE_FUNCTION = ("bb33b7a0da3d2740", "55eb952812cac1fb")
"""Fingerprints of Keras's `_make_function`: 3.12.0 to 3.15.1 (its step converts
Optionals), 3.8.0 to 3.11.3."""

FIXES = (
    Fix(
        issue=ISSUE,
        affects="steps_per_execution > 1 on several replicas",
        owner=_TRAINER,
        attribute="_make_function",
        replacement=_make_function,
        refuses_when=_several_steps_on_several_replicas,
        relies_on={
            # wrapped; its function takes an iterator, runs steps_per_execution steps
            f"{_TRAINER}._make_function": KERAS_MAKE_FUNCTION,
            # what each of our steps runs after strategy.run, as Keras's does
            f"{_TRAINER_MODULE}:reduce_per_replica": "2e7d54b1e6edc29a",
        },
    ),
)
