"""Every replica's `add_loss` terms, and activity regularization as on one device.

Keras keeps the terms that `add_loss` adds (activity regularizers' too) in a list on
the layer, `Layer._losses`, and every replica shares the layer. `MirroredStrategy`
traces its replicas in turn, one thread each, and switches between them at every
cross-replica call. Where a step all-reduces between the forward pass and reading
`model.losses` (synchronized batch norm, Keras's own `synchronized=True` too;
strategykit's exact metrics), every replica reads the terms of the replica traced last,
and the other replicas' terms are lost, silently (no upstream issue found).

Both apply only under a strategy strategykit made or sharded for.

* `Layer._losses` becomes a property: in a replica context of several replicas each
  replica's thread has a list of its own for the layer; elsewhere it is the layer's own
  list, as before.
* `Layer.activity_regularizer` becomes a property. In a step of `fit()`/`evaluate()`
  (`strategykit.batches.current_step`) or a replica context of several replicas it
  gives a regularizer whose term is one device's (`strategykit.batches.activity`): the
  real examples of `sk.shard`'s padded final batch only, and on Keras 3.8 to 3.13, where
  the term is a sum over the batch that Keras scales by 1/replicas
  (keras-team/keras#22018; 3.14 divides it by the batch size), times the replicas.
  Elsewhere it is the layer's own regularizer (`get_config` and saving are unchanged).

Terms that `add_loss` adds are, as Keras defines them under a strategy, averaged over
the replicas: a term that is a mean over the batch (or depends on weights only) trains
as on one device; a term that is a *sum* over the batch is 1/N of one device's on N
replicas, as in plain Keras (`sk.check` shows it).

Example:
    >>> import strategykit as sk
    >>> from strategykit.upstream import replica_losses
    >>> replica_losses.PER_REPLICA_LOSSES.attribute
    '_losses'
"""

from __future__ import annotations

import functools
import threading
import weakref

import tensorflow as tf

from strategykit.batches import activity, current_step
from strategykit.made import strategies
from strategykit.pinning.fix import Fix, UnknownUpstreamCode, fingerprint
from strategykit.pinning.pinned_access import PinnedAccess

_LAYER = "keras.src.layers.layer:Layer"
_per_thread = threading.local()  # MirroredStrategy traces each replica in its own thread


def several_replicas_tracing() -> bool:
    """Whether the caller runs in a replica context of more than one replica, of a
    strategy strategykit made or sharded for (`strategykit.made.strategies`): where
    these fixes and `reported_losses` apply."""
    return (strategies.in_ours() and not tf.distribute.in_cross_replica_context()
            and tf.distribute.get_strategy().num_replicas_in_sync > 1)


# Layer._losses: one list per replica.

def _get_losses(layer):
    if several_replicas_tracing():
        lists = getattr(_per_thread, "losses", None)
        if lists is None:
            lists = _per_thread.losses = weakref.WeakKeyDictionary()
        return lists.setdefault(layer, [])
    return layer.__dict__.setdefault("_losses", [])


def _set_losses(layer, value):
    layer.__dict__["_losses"] = value


class _RefusingList(list):
    """The `_losses` of a replica on unknown Keras code: adding a loss refuses."""

    def __init__(self, message: str):
        super().__init__()
        self.message = message

    def _refuse(self, *args):
        raise UnknownUpstreamCode(self.message)

    append = extend = __iadd__ = _refuse


def _refusing_losses(fix: Fix) -> property:
    def get(layer):
        if several_replicas_tracing():
            return _RefusingList(fix.refusal())
        return layer.__dict__.setdefault("_losses", [])

    return property(get, _set_losses)


PER_REPLICA_LOSSES = Fix(
    issue="keras-team/keras (unreported)",
    affects="add_loss and activity regularizers on several replicas",
    owner=_LAYER,
    attribute="_losses",
    replacement=property(_get_losses, _set_losses,
                         doc="This replica's `add_loss` terms (strategykit)."),
    relies_on={
        f"{_LAYER}.add_loss": ("4d3e41c66f25bcaa", "7f70f38e2f25640d"),
        f"{_LAYER}._get_own_losses": "bce6599684980e77",
        f"{_LAYER}._clear_losses": ("ad0524e511c14c68", "9e906f0d5c292178"),
        f"{_LAYER}.losses": "32901b90c62f29a3",
    },
    guard=_refusing_losses,
)


# Layer.activity_regularizer: one device's term, over the real examples.

_SUM_OVER_BATCH = ("a574c14d7e53e7ec",  # 3.8
                   "4a3c8ec158acc6ce",  # 3.9
                   "26c2a8eeb1c7ac58",  # 3.10
                   "23d75e1c7be35a42")  # 3.11 to 3.13
_MEAN_OVER_BATCH = "4fb7e42e4ffd9b1a"  # 3.14, 3.15: divided by the batch size


@functools.cache
def _keras_divides() -> bool:
    """Whether Keras divides an activity regularizer's term by the batch size (3.14+)."""
    return fingerprint(f"{_LAYER}.__call__") == _MEAN_OVER_BATCH


class _OverRealExamples:
    """An activity regularizer as Keras should see it in a step: `activity.term`."""

    def __init__(self, regularizer):
        self.regularizer = regularizer

    def __call__(self, output):
        return activity.term(self.regularizer, output, _keras_divides())


def _rescaled() -> bool:
    """Where Keras's term is not one device's: a step of fit()/evaluate() (whose batch
    may hold padded copies), or any replica context of several replicas."""
    return current_step.current() is not None or several_replicas_tracing()


def _get_activity_regularizer(layer):
    regularizer = layer.__dict__.get("activity_regularizer")
    if regularizer is not None and _rescaled():
        return _OverRealExamples(regularizer)
    return regularizer


def _set_activity_regularizer(layer, value):
    # A layer built inside a step may pass its (rescaled) regularizer on to a sublayer.
    layer.__dict__["activity_regularizer"] = (
        value.regularizer if isinstance(value, _OverRealExamples) else value)


def _refusing_activity_regularizer(fix: Fix) -> property:
    def get(layer):
        regularizer = layer.__dict__.get("activity_regularizer")
        step = current_step.current()
        if regularizer is not None and (several_replicas_tracing() or (
                step is not None and step.real is not None)):
            raise UnknownUpstreamCode(fix.refusal())
        return regularizer

    return property(get, _set_activity_regularizer)


ACTIVITY_REGULARIZER = Fix(
    issue="keras-team/keras#22018",
    affects="activity regularizers on several replicas or a padded batch",
    owner=_LAYER,
    attribute="activity_regularizer",
    replacement=property(_get_activity_regularizer, _set_activity_regularizer,
                         doc="The layer's activity regularizer (strategykit)."),
    relies_on={f"{_LAYER}.__call__": (*_SUM_OVER_BATCH, _MEAN_OVER_BATCH)},
    guard=_refusing_activity_regularizer,
)

FIXES = (PER_REPLICA_LOSSES, ACTIVITY_REGULARIZER)


# Each layer's own add_loss terms, for sk.check to name a layer whose term differs.

OWN_TERMS = PinnedAccess(
    issue="keras-team/keras (unreported)",
    affects="sk.check naming a layer whose add_loss term differs",
    relies_on={f"{_LAYER}._flatten_layers": "662dcf281bc32c53",
               f"{_LAYER}._get_own_losses": "bce6599684980e77"},
    refuses=False)
PINNED = (OWN_TERMS,)


def own_terms_by_layer(model) -> list | None:
    """`[(layer, terms)]`: every layer of `model` (nested ones too, `model` first) with the
    terms its last call added (`add_loss`, its activity regularizer; not its weights'
    regularizers, nor its sublayers' terms); this replica's in a replica context. None
    on Keras code not checked."""
    if not OWN_TERMS.known():
        return None
    return [(layer, list(layer._get_own_losses())) for layer in model._flatten_layers()]
