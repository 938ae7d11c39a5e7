"""keras-team/keras#20585: Keras 3 `fit()`, `evaluate()`, `predict()` across workers.

Under `tf.distribute.MultiWorkerMirroredStrategy` with several workers, Keras 3 (on
TensorFlow 2.16 and later) fails in two places; both fixes act only there, and hand over
to Keras's own code on a single worker and under every strategy strategykit did not make
(`strategykit.made.strategies`):

* `TensorFlowTrainer._maybe_symbolic_build` builds the model from the first input batch,
  which it reduces over the replicas with `strategy.reduce("MEAN", batch, axis=None)`,
  to get one batch of the per-replica shapes. Across workers that eager reduce raises
  `Attempt to convert a value (PerReplica...) to a Tensor`. The fix builds from this
  worker's first replica's batch instead: the same shapes and dtypes, no collective.
* `reduce_per_replica(logs, strategy, "auto")`, which reduces the step's logs (metric
  results: scalars), calls `strategy.reduce("MEAN", v, axis=0)` across workers, which
  fails with `Invalid reduction dimension 0 for input with 0 dimensions`. On one worker
  Keras takes the element-wise mean over the replicas (`tf.reduce_mean(values,
  axis=0)` of the stacked replicas' values); across workers that is
  `strategy.reduce("MEAN", v, axis=None)`, which the fix calls.

The first fix also serves `strategykit.upstream.epoch_input`, under every strategy: for
`sk.shard` data it builds the model from `example_batch_of(iterator)` (zeros of the
data's shapes), so that building reads nothing from the pipeline Keras keeps. And when
the model, its compiled metrics and its compiled loss are all built (every `fit()` and
`evaluate()` after the first, and every validation of a `fit()`), it reads no batch at
all: upstream starts an iterator of the data (0.2 to 0.7 s under several replicas) to
take a batch that `_symbolic_build` then ignores. When it must build, on one worker, it
builds from the data's `tf.TensorSpec`s of one replica's batch (`_symbolic_build` reads
only the shapes and dtypes of the batch), unless they leave a shape unknown beyond the
batch dimension, where it reads a batch as upstream does.

Keras's other reductions across workers (`"concat"` for `predict()`, `"sum"`) work and
are left as they are.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from strategykit.cluster.roles import is_multi_worker
from strategykit.made import model_scope, strategies
from strategykit.pinning.fix import Fix, original, resolve
from strategykit.upstream import epoch_input, keras_batches, steps_per_execution
from strategykit.upstream.every_fit import add_to_every_fit

_TRAINER_MODULE = "keras.src.backend.tensorflow.trainer"
_TRAINER = f"{_TRAINER_MODULE}:TensorFlowTrainer"


def _needs_a_batch(model) -> bool:
    """Whether `_symbolic_build` would read a batch: as its own test, some layer, the
    compiled metrics or the compiled loss not built yet."""
    return (not all(layer.built for layer in model._flatten_layers())
            or (model._compile_metrics is not None and not model._compile_metrics.built)
            or (model._compile_loss is not None and not model._compile_loss.built))


def _replica_batch_specs(epoch_iterator, strategy):
    """The `tf.TensorSpec`s of one replica's batch of a Keras epoch iterator's data, or
    None where they say less than a batch would (a shape unknown beyond the batch
    dimension, a ragged or sparse value): all `_symbolic_build` reads of a batch is its
    shapes and dtypes."""
    spec = getattr(getattr(epoch_iterator, "_distributed_dataset", None), "element_spec",
                   None)
    if spec is None:
        return None
    replicas = strategy.num_replicas_in_sync

    def one_replica(value_spec):
        if not isinstance(value_spec, tf.TensorSpec):  # per replica: one spec each
            parts = tf.nest.flatten(value_spec, expand_composites=True)
            if (len(parts) != replicas or not isinstance(parts[0], tf.TensorSpec)
                    or any(part != parts[0] for part in parts)):
                raise _Unknown
            value_spec = parts[0]
        if value_spec.shape.rank is None or not value_spec.shape[1:].is_fully_defined():
            raise _Unknown
        return value_spec

    try:
        return tf.nest.map_structure(one_replica, spec)
    except _Unknown:
        return None


class _Unknown(Exception):
    """A value whose batch shape its spec does not tell."""


def _ours(model, iterator) -> bool:
    """Whether `model` is of a strategy of strategykit's or fed `sk.shard`'s data."""
    return strategies.is_ours(model._distribute_strategy) or model_scope.strategy_of(
        getattr(iterator, "_distributed_dataset", None)) is not None


def _build_from_first_replica(self, iterator=None, data_batch=None):
    if not _ours(self, iterator):
        return original(resolve(_TRAINER), "_maybe_symbolic_build")(
            self, iterator=iterator, data_batch=data_batch)
    keras_batches.note(self, iterator)
    add_to_every_fit(keras_batches.TrainingData)
    if type(self).call is keras.Model.call:
        # A model without call() (keras.io's GAN) cannot be built symbolically; as on one
        # device, its layers are built where its train_step first uses them.
        return None
    model_scope.check(self, getattr(iterator, "_distributed_dataset", None),
                      "fit() or evaluate()")
    strategy = self._distribute_strategy
    if data_batch is None and iterator is not None and not _needs_a_batch(self):
        iterator = None  # built: upstream would start an iterator for a batch it ignores
    example = epoch_input.example_batch_of(iterator) if data_batch is None else None
    if example is not None:  # sk.shard data: its shapes, without reading an example
        data_batch, iterator = example, None
    elif (iterator is not None and strategy is not None and not is_multi_worker(strategy)
          and (specs := _replica_batch_specs(iterator, strategy)) is not None):
        data_batch, iterator = specs, None  # the shapes alone: no iterator started
    elif iterator is not None and strategy is not None and is_multi_worker(strategy):
        for *_, batches in iterator:  # as upstream: the first batch of the first epoch
            batch = next(batches)
            break
        data_batch = tf.nest.map_structure(
            lambda value: strategy.experimental_local_results(value)[0], batch)
        iterator = None
    return original(resolve(_TRAINER), "_maybe_symbolic_build")(
        self, iterator=iterator, data_batch=data_batch)


def _build_needs_the_fix(model, iterator=None, data_batch=None) -> bool:
    """Where upstream's build fails (several workers) or would read an example of
    `sk.shard`'s data (its pipeline must start at the training position)."""
    strategy = model._distribute_strategy
    return data_batch is None and iterator is not None and _ours(model, iterator) and (
        epoch_input.source_of(getattr(iterator, "_distributed_dataset", None)) is not None
        or (strategy is not None and is_multi_worker(strategy)))


def _reduces_across_workers(values, strategy, reduction) -> bool:
    return (reduction in ("auto", "mean") and strategies.is_ours(strategy)
            and is_multi_worker(strategy))


def _reduce_logs_across_workers(values, strategy, reduction):
    if _reduces_across_workers(values, strategy, reduction):
        return tf.nest.map_structure(
            lambda value: strategy.reduce(tf.distribute.ReduceOp.MEAN, value, axis=None),
            values)
    return original(resolve(_TRAINER_MODULE), "reduce_per_replica")(values, strategy, reduction)


FIXES = (
    Fix(
        issue="keras-team/keras#20585",
        affects="fit() across several workers, and fit() of sk.shard data",
        owner=_TRAINER,
        attribute="_maybe_symbolic_build",
        replacement=_build_from_first_replica,
        refuses_when=_build_needs_the_fix,
        relies_on={  # replaced; takes the first batch of the epoch iterator
            # (up to Keras 3.10: epochs of (step, iterator), as epoch_input says)
            f"{_TRAINER}._maybe_symbolic_build": ("92a504f5eba9b29f", "181752273e37d689"),
            # reads the batch only when a layer, the compiled metrics or loss is unbuilt
            "keras.src.trainers.trainer:Trainer._symbolic_build": (
                "96220cc3b88fe768", "9e2c2441c8d68292", "330210b83242a6af"),
        },
    ),
    Fix(
        issue="keras-team/keras#20585",
        affects="fit() and evaluate() across several workers",
        owner=_TRAINER_MODULE,
        attribute="reduce_per_replica",
        replacement=_reduce_logs_across_workers,
        refuses_when=_reduces_across_workers,
        relies_on={
            # replaced; "auto" means "mean" outside TPUs
            f"{_TRAINER_MODULE}:reduce_per_replica": "2e7d54b1e6edc29a",
            # reduces the train and test steps' logs with "auto"
            f"{_TRAINER}._make_function": steps_per_execution.KERAS_MAKE_FUNCTION,
            # predict()'s "concat" across workers: works, left as it is
            f"{_TRAINER_MODULE}:_multi_worker_concat": "2137073bfe27fb92",
        },
    ),
)
