"""`predict()` of `sk.shard` data: a hook, and predictions concatenated as Keras does.

Keras's `predict()` concatenates each step's outputs replica by replica and cannot tell
the copies `sk.shard` pads its final batch with: of 202 examples on 4 replicas with a
global batch of 64 it returned 256 rows. Keras has no hook for data to say so (no
upstream issue: the copies are strategykit's). The fix replaces
`TensorFlowTrainer.predict`: a dataset registered here (`strategykit.data.predict_input`
registers `sk.shard`'s) is predicted by the function registered with it, which gets
Keras's own `predict()`; any other `x` goes to Keras's own. `concatenation` joins
per-replica values as Keras joins predictions (its `reduce_per_replica`, one worker or
several). Where each replica's step compiles with XLA, every `predict()` runs inside
`strategykit.xla.replica_steps.predicting_per_replica`. Checked on Keras 3.8.0 to 3.15.1.
"""

from __future__ import annotations

import functools
import weakref

import tensorflow as tf

from strategykit.cluster.roles import is_multi_worker
from strategykit.made import model_scope
from strategykit.pinning.fix import Fix, original, resolve
from strategykit.xla import replica_steps as xla_steps

_MODULE = "keras.src.backend.tensorflow.trainer"
_TRAINER = f"{_MODULE}:TensorFlowTrainer"
_PREDICTORS = weakref.WeakKeyDictionary()  # dataset -> predict(model, keras_predict, ...)


def register(dataset, predict) -> None:
    """Makes `model.predict(dataset, **options)` return `predict(model, keras_predict,
    **options)`, where `keras_predict(x, **options)` is Keras's own `model.predict`.

    Example:
        >>> import tensorflow as tf
        >>> data = tf.data.Dataset.range(3)
        >>> register(data, lambda model, keras_predict, **options: "predicted")
        >>> predictor_of(data) is not None
        True
    """
    _PREDICTORS[dataset] = predict


def predictor_of(dataset):
    """The `predict` registered for `dataset`, or None."""
    try:
        return _PREDICTORS.get(dataset)
    except TypeError:  # not weakly referable (numpy arrays, lists): not registered
        return None


def concatenation(strategy):
    """A function joining a step's per-replica values (a tensor each) in the order
    Keras's `predict()` joins that step's outputs, on one worker or several."""
    reduce_per_replica = resolve(f"{_MODULE}:reduce_per_replica")

    def concat(values):
        return reduce_per_replica(values, strategy, reduction="concat")

    # Across workers a collective: traced once, rather than run eagerly at every step.
    return tf.function(concat) if is_multi_worker(strategy) else concat


def _predict(self, x, batch_size=None, verbose="auto", steps=None, callbacks=None):
    keras_predict = functools.partial(original(resolve(_TRAINER), "predict"), self)
    options = {"batch_size": batch_size, "verbose": verbose, "steps": steps,
               "callbacks": callbacks}
    predict = predictor_of(x)
    model_scope.check(self, x, "predict()")
    with xla_steps.predicting_per_replica(self):
        return keras_predict(x, **options) if predict is None else predict(
            self, keras_predict, **options)


FIXES = (
    Fix(
        issue="keras-team/keras (unreported)",
        affects="predict() of sk.shard data (one row per example, in order)",
        owner=_TRAINER,
        attribute="predict",
        replacement=_predict,
        refuses_when=lambda model, x, *args, **kwargs: predictor_of(x) is not None,
        relies_on={
            # replaced where it applies: calls make_predict_function(), then
            # predict_function(a list of steps' batches) for each execution and
            # concatenates their outputs in order (3.8.0; 3.9.0 to 3.10.0; 3.11.0 to
            # 3.15.1, which differ in the callbacks' history and steps)
            f"{_TRAINER}.predict": ("f106afa45e51d558", "6cf352a405e752a9",
                                    "ee5831d7d2179667"),
            # each step's outputs concatenated over the replicas by reduce_per_replica
            # (3.8.0 to 3.11.3; 3.12.0 to 3.15.1, which converts optionals first)
            f"{_TRAINER}.make_predict_function": ("5f1a30acee30e08c", "a772a2efdd906f9a"),
            # called by `concatenation` (3.8.0 to 3.15.1)
            f"{_MODULE}:reduce_per_replica": "2e7d54b1e6edc29a",
        },
    ),
)
