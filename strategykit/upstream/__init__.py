"""Fixes for gaps in Keras 3 and TensorFlow, all in this one package.

Each fix is a `Fix` (`fix.py`): the upstream issue it closes, what users lose without
it, the private upstream code it relies on (with the fingerprints of that code on every
Keras release of the supported range, `versions.py`), and the one attribute it replaces.
Before it replaces anything a fix compares those fingerprints with the installed code:
on code it knows it installs (or, where upstream has fixed the gap, says it is not
needed); on code it does not know it installs a guard that hands over to upstream's
own code except where the fix is needed, and raises `UnknownUpstreamCode` there, after
one `UpstreamVersionWarning`. tests/upstream/test_upstream.py fails on an unknown
version too, so an upgrade is caught by CI before users. A fix is installed once
(installing again does nothing) and applies only in the situation it fixes; everywhere
else the replaced code hands over to the original. Where Keras's code differs between
releases, a fix carries what each needs, chosen by the fingerprint of the code it finds.
Nothing else in strategykit touches private Keras or TensorFlow code.

`install()` installs every fix. `sk.mirrored()` and `sk.from_env()` call it when they
build a strategy, and `sk.shard()` when it shards data, so the fixes are active under
every strategy strategykit builds or shards for;
importing strategykit alone changes nothing in Keras. A fix that must replace several
attributes is several `Fix` entries naming the same issue.

Fixes, one module each:

* `metric_variables`, keras-team/keras#21061: metric variables synchronized on read
  under a strategy, as from Keras 3.10 (on Keras 3.8 and 3.9 they are mirrored, and the
  metrics and loss Keras reports under several replicas are wrong).
* `distributed_datasets`, keras-team/keras#20134: Keras 3.8's `fit()` takes the
  datasets of `strategy.distribute_datasets_from_function` (as from Keras 3.9).
* `log_values`, Keras before 3.12: a metric whose `result()` returns its variable is
  reported as a number (not TensorFlow's `SyncOnReadVariable`).
* `accumulation`, keras-team/keras#20582: `gradient_accumulation_steps` of any Keras
  optimizer under a `tf.distribute` strategy, in `fit()` and in custom loops.
* `multi_worker`, keras-team/keras#20585: `fit()`, `evaluate()` and `predict()` under a
  `MultiWorkerMirroredStrategy` of several workers.
* `worker_files`, keras-team/keras#20585: Keras's file-writing callbacks
  (`ModelCheckpoint`, `CSVLogger`, `TensorBoard`) write only on the chief.
* `exact_metrics`, tensorflow/tensorflow#39268: Keras's metrics and its `loss` over
  the real examples of `sk.shard`'s padded final batch, with the user's weights.
* `epoch_input`, tensorflow/tensorflow#67677: Keras reads `sk.shard` data through one
  iterator for many epochs (and other distributed data through one iterator an epoch,
  not two), never past an epoch's end.
* `steps_per_execution`, keras-team/keras#19246: `steps_per_execution` > 1 under several
  replicas, with all-reduces in the steps (synchronized batch norm, exact metrics).
* `class_weights`, tensorflow/tensorflow#41290: `fit(class_weight=...)` of `sk.shard`
  data, the class weights multiplied into its weights before it is distributed.
* `replica_losses`: every replica's `add_loss` and activity-regularization terms count
  (Keras keeps them on the layer, which the replicas share; no upstream issue found),
  and activity regularizers sum to one device's term on Keras 3.8 to 3.13
  (keras-team/keras#22018).
* `reported_losses`: a loss that a custom `train_step` reports through a `Mean`
  metric is one device's value, not 1/N of it (no upstream issue found).
* `optimizer_build`, keras-team/keras#20164: an optimizer first built in a custom
  `train_step` (a GAN's) under a strategy creates its variables out of the traced step.
* `traceback_frames`: Keras hides strategykit's frames from tracebacks as its own (no
  upstream issue).
* `iterator_reaper`: deletes the iterators that are done with on a thread of its own
  (TensorFlow's deletion can block for a minute); not a `Fix`.
* `metric_state`: `sk.combine_across_replicas`, how a metric's state that is not a sum
  combines across replicas (Keras only sums or averages it); not a `Fix`, used by
  `exact_metrics`.
* `step_count`: the steps Keras reads from a distributed dataset; not a `Fix` but
  `state_steps`, which `sk.shard` applies to the datasets it makes.
* `coordination`: the job's key-value store (TensorFlow's coordination service),
  which `sk.callbacks.BackupAndRestore` agrees on a preemption step through.
* `every_fit`: callbacks strategykit adds to every `fit()` (public API, no `Fix`).
* `versions`: the TensorFlow and Keras releases supported and checked (plain data, for
  the matrix, the docs and the run-time check).

Example:
    >>> import keras, strategykit as sk
    >>> strategy = sk.mirrored(replicas=2)  # doctest: +SKIP
    >>> with strategy.scope():  # doctest: +SKIP
    ...     model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    ...     model.compile(keras.optimizers.Adam(gradient_accumulation_steps=4), "mse")
    >>> sorted({fix.issue for fix in sk.upstream.FIXES})  # doctest: +NORMALIZE_WHITESPACE
    ['keras-team/keras (unreported)', 'keras-team/keras#19246', 'keras-team/keras#20134',
     'keras-team/keras#20164', 'keras-team/keras#20582', 'keras-team/keras#20585',
     'keras-team/keras#21061', 'keras-team/keras#22018', 'keras-team/keras@3.12.0',
     'tensorflow/tensorflow#39268', 'tensorflow/tensorflow#41290',
     'tensorflow/tensorflow#67677']
"""

from __future__ import annotations

import warnings

import keras
import tensorflow as tf

from strategykit.upstream import (
    accumulation,
    class_weights,
    distributed_datasets,
    epoch_input,
    exact_metrics,
    log_values,
    metric_variables,
    multi_worker,
    optimizer_build,
    replica_losses,
    reported_losses,
    steps_per_execution,
    traceback_frames,
    worker_files,
)
from strategykit.upstream.coordination import COORDINATION_RELIES_ON
from strategykit.upstream.fix import (
    CHECKED_ON,
    Fix,
    UnknownUpstreamCode,
    fingerprint,
    original,
    resolve,
)
from strategykit.upstream.step_count import STEPS_RELIES_ON, state_steps

FIXES = (*metric_variables.FIXES, *distributed_datasets.FIXES, *log_values.FIXES,
         *accumulation.FIXES, *multi_worker.FIXES, *worker_files.FIXES, *exact_metrics.FIXES,
         *epoch_input.FIXES, *steps_per_execution.FIXES, *replica_losses.FIXES,
         *reported_losses.FIXES, *optimizer_build.FIXES, *traceback_frames.FIXES,
         *class_weights.FIXES)
"""Every fix, in the order `install()` installs them."""

__all__ = ["CHECKED_ON", "COORDINATION_RELIES_ON", "FIXES", "STEPS_RELIES_ON", "Fix",
           "UnknownUpstreamCode", "UpstreamVersionWarning", "fingerprint", "install",
           "original", "resolve", "state_steps", "status", "uninstall"]


class UpstreamVersionWarning(UserWarning):
    """Keras or TensorFlow code that a strategykit fix was not checked on: the features
    it names refuse when used; everything else works."""


_warned = [False]


def install() -> None:
    """Installs every fix; idempotent. `sk.mirrored()`, `sk.from_env()` and `sk.shard()`
    call it.

    Each fix first compares its fingerprints with those of the versions it was checked
    on. Where the code is unknown it installs a guard instead (the feature it fixes
    raises `UnknownUpstreamCode` when used), and the first such install warns once, in
    one line, with an `UpstreamVersionWarning`.

    Example:
        >>> from strategykit import upstream
        >>> upstream.install()
        >>> all(fix.state() in ("installed", "not needed") for fix in upstream.FIXES)
        True
    """
    unknown = [fix for fix in FIXES if not fix.install()]
    if unknown and not _warned[0]:
        _warned[0] = True

        def features(fixes) -> str:
            return "; ".join(dict.fromkeys(fix.affects for fix in fixes))

        refusing = [fix for fix in unknown if fix.refuses_when is not None]
        as_upstream = [fix for fix in unknown if fix.refuses_when is None]
        warnings.warn(
            f"strategykit was not checked on TensorFlow {tf.__version__} + Keras "
            f"{keras.__version__} (checked on: {CHECKED_ON}): private upstream code it "
            "fixes differs, so "
            + (f"these refuse with an error when used: {features(refusing)}" if refusing
               else "")
            + ("; " if refusing and as_upstream else "")
            + (f"these work as upstream's own code does: {features(as_upstream)}"
               if as_upstream else "")
            + ". Everything else works. Install a checked pair, or see `strategykit info`.",
            UpstreamVersionWarning, stacklevel=2)


def uninstall() -> None:
    """Removes every fix, restoring Keras and TensorFlow as they were (for tests)."""
    for fix in FIXES:
        fix.uninstall()


def status() -> list[dict]:
    """Each fix's state, as `strategykit info` lists it.

    Returns:
        One dict per fix: `issue`, `affects`, `replaces` (the upstream attribute),
        `state` (`"installed"`, `"not needed"`, `"refusing"`, `"upstream's own"` or
        `"not installed"`, see `Fix.state`) and `unknown` (the upstream code that
        differs from what the fix was checked on, with its fingerprint: empty on a
        checked version).

    Example:
        >>> from strategykit import upstream
        >>> upstream.install()
        >>> {entry["state"] for entry in upstream.status()} <= {"installed", "not needed"}
        True
    """
    return [{"issue": fix.issue, "affects": fix.affects,
             "replaces": f"{fix.owner}.{fix.attribute}", "state": fix.state(),
             "unknown": fix.unknown_code()} for fix in FIXES]
