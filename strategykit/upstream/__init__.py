"""Fixes for gaps in Keras 3 and TensorFlow, all in this one package.

Each fix is a `Fix` (`strategykit.pinning.fix`): the upstream issue it closes, what
users lose without it, the private upstream code it relies on (with the fingerprints of
that code on every Keras release of the supported range, `strategykit.pinning.versions`),
and the one attribute it replaces.
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
every strategy strategykit builds or shards for, and only there: each asks
`strategykit.made.strategies` (or whether the data is `sk.shard`'s) before it changes
anything, so a model of any other strategy, or on one device, runs Keras's own code.
Importing strategykit alone changes nothing in Keras. A fix that must replace several
attributes is several `Fix` entries naming the same issue.

Each module's docstring says what it fixes or pins, its upstream issue and the versions
it was checked on; `strategykit info` and docs/compatibility.md list them by feature.
The `Fix`es replace an attribute each; the `PinnedAccess`es (`coordination`,
`step_count`, `strategy_internals`, `dataset_inputs`) read, set or call private code
without replacing it, and are checked the same way, once per process (both records:
`strategykit.pinning`). How a metric's copies combine (`sk.combine_across_replicas`),
public API only, is `strategykit.metrics`.

Example:
    >>> import keras, strategykit as sk
    >>> strategy = sk.mirrored(replicas=2)  # doctest: +SKIP
    >>> with strategy.scope():  # doctest: +SKIP
    ...     model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    ...     model.compile(keras.optimizers.Adam(gradient_accumulation_steps=4), "mse")
    >>> sorted({fix.issue for fix in sk.upstream.FIXES})  # doctest: +NORMALIZE_WHITESPACE
    ['keras-team/keras (unreported)', 'keras-team/keras#19005', 'keras-team/keras#19246',
     'keras-team/keras#20134',
     'keras-team/keras#20164', 'keras-team/keras#20582', 'keras-team/keras#20585',
     'keras-team/keras#21061', 'keras-team/keras#22018',
     'keras-team/keras-hub (unreported)', 'keras-team/keras@3.12.0', 'tensorflow/tensorflow#39268',
     'tensorflow/tensorflow#41290', 'tensorflow/tensorflow#67677']
"""

from __future__ import annotations

import warnings

import keras
import tensorflow as tf

from strategykit.pinning import imports
from strategykit.pinning.fix import (
    CHECKED_ON,
    Fix,
    UnknownUpstreamCode,
    fingerprint,
    original,
    resolve,
)
from strategykit.pinning.pinned_access import PinnedAccess
from strategykit.upstream import (
    accumulation,
    batch_norm_moments,
    class_weights,
    coordination,
    dataset_inputs,
    distributed_datasets,
    epoch_input,
    every_fit,
    exact_metrics,
    exact_predictions,
    gradient_clipping,
    keras_hub_pipelines,
    log_values,
    metric_variables,
    multi_worker,
    optimizer_build,
    replica_losses,
    reported_losses,
    saved_layers,
    sparse_gradients,
    step_count,
    steps_per_execution,
    strategy_internals,
    traceback_frames,
    worker_files,
    xla_steps,
)
from strategykit.upstream.step_count import state_steps

FIXES = (*metric_variables.FIXES, *distributed_datasets.FIXES, *log_values.FIXES,
         *accumulation.FIXES, *multi_worker.FIXES, *worker_files.FIXES, *exact_metrics.FIXES,
         *epoch_input.FIXES, *steps_per_execution.FIXES, *replica_losses.FIXES,
         *reported_losses.FIXES, *optimizer_build.FIXES, *traceback_frames.FIXES,
         *class_weights.FIXES, *every_fit.FIXES, *sparse_gradients.FIXES,
         *gradient_clipping.FIXES, *exact_predictions.FIXES, *batch_norm_moments.FIXES,
         *keras_hub_pipelines.FIXES, *xla_steps.FIXES, *saved_layers.FIXES)
"""Every fix, in the order `install()` installs them."""

PINNED = (*coordination.PINNED, *step_count.PINNED, *strategy_internals.PINNED,
          *dataset_inputs.PINNED, *replica_losses.PINNED)
"""Every `PinnedAccess`: private code read, set or called without replacing it."""

__all__ = ["CHECKED_ON", "FIXES", "PINNED", "Fix", "PinnedAccess", "UnknownUpstreamCode",
           "UpstreamVersionWarning", "fingerprint", "install", "original", "resolve",
           "state_steps", "status", "uninstall"]


class UpstreamVersionWarning(UserWarning):
    """Keras or TensorFlow code that a strategykit fix was not checked on: the features
    it names refuse when used; everything else works."""


_warned = [False]
_awaited: set = set()  # optional packages whose fixes install when they are imported


def install() -> None:
    """Installs every fix; idempotent. `sk.mirrored()`, `sk.from_env()` and `sk.shard()`
    call it.

    Each fix first compares its fingerprints with those of the versions it was checked
    on. Where the code is unknown it installs a guard instead (the feature it fixes
    raises `UnknownUpstreamCode` when used), and the first such install warns once, in
    one line, with an `UpstreamVersionWarning`. A fix of an optional package's code
    (keras-hub's) is installed when the program imports that package, before or after
    this call: strategykit never imports it itself.

    Example:
        >>> from strategykit import upstream
        >>> upstream.install()
        >>> {fix.state() for fix in upstream.FIXES} <= {"installed", "not needed", "on import"}
        True
    """
    for package in {fix.package for fix in FIXES if not fix.imported()} - _awaited:
        _awaited.add(package)
        imports.when_imported(package, install)
    unknown = [fix for fix in FIXES if not fix.install()]
    unknown += [access for access in PINNED if not access.known()]
    if unknown and not _warned[0]:
        _warned[0] = True

        def features(entries) -> str:
            return "; ".join(dict.fromkeys(entry.affects for entry in entries))

        refusing = [entry for entry in unknown if _refuses(entry)]
        as_upstream = [entry for entry in unknown if not _refuses(entry)]
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


def _refuses(entry) -> bool:
    """Whether a fix or pinned access refuses on unknown code (else upstream's own)."""
    if isinstance(entry, PinnedAccess):
        return entry.refuses
    return entry.refuses_when is not None or entry.guard is not None


def uninstall() -> None:
    """Removes every fix, restoring Keras and TensorFlow as they were (for tests)."""
    for fix in FIXES:
        fix.uninstall()


def status() -> list[dict]:
    """Each fix's state, as `strategykit info` lists it.

    Returns:
        One dict per fix and pinned access: `issue`, `affects`, `replaces` (the
        upstream attribute; None for an access), `state` (`"installed"`, `"not
        needed"`, `"refusing"`, `"upstream's own"`, `"not installed"`, `"on import"`
        or `"no package"`, see `Fix.state`; `"checked"` for an access on the code
        pinned, see `PinnedAccess.state`) and `unknown` (the upstream code that
        differs from what the fix was checked on, with its fingerprint: empty on a
        checked version).

    Example:
        >>> from strategykit import upstream
        >>> upstream.install()
        >>> states = {entry["state"] for entry in upstream.status()}
        >>> states <= {"installed", "not needed", "checked", "on import"}
        True
    """
    return [{"issue": fix.issue, "affects": fix.affects,
             "replaces": f"{fix.owner}.{fix.attribute}", "state": fix.state(),
             "unknown": fix.unknown_code()} for fix in FIXES] + [
        {"issue": access.issue, "affects": access.affects, "replaces": None,
         "state": access.state(), "unknown": access.unknown_code()} for access in PINNED]
