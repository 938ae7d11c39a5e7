"""keras-team/keras#20585: Keras's file-writing callbacks write once across workers.

In a `fit()` across several workers every worker runs every callback, so
`ModelCheckpoint`, `CSVLogger` and `TensorBoard` write the same files from every worker
(at once, into the same paths when the workers share a disk). Keras 2 sent the other
workers' writes to temporary directories; Keras 3 has nothing of the kind. These fixes
give each of the three callbacks a `set_model` (Keras calls it at the start of every
`fit()`, `evaluate()` and `predict()`) that points the callback's path attribute at
`strategykit.cluster.chief_files.writable_path(...)` first: the user's path on the chief, a
scratch path on every other worker. On the chief, under any other strategy of
strategykit's and under every strategy strategykit did not make, the path stays what the
user gave. The user's callback list stays as on one machine.
"""

from __future__ import annotations

from strategykit.cluster.chief_files import writable_path
from strategykit.cluster.roles import is_multi_worker
from strategykit.made import strategies
from strategykit.pinning.fix import Fix, original, resolve

_CALLBACKS = "keras.src.callbacks"
# The callbacks that write files: the attribute holding the path each writes to, and the
# fingerprints of its `__init__` and `set_model` (Keras's `Callback.set_model` when the
# class has none of its own).
_PATH_ATTRIBUTES = {
    f"{_CALLBACKS}.model_checkpoint:ModelCheckpoint":
        ("filepath", ("15332c3008899db7", "714ae1a794a0da77", "0bd84765bf2adaa2"),
         "b050c47cb15d8cdb"),
    f"{_CALLBACKS}.csv_logger:CSVLogger":
        ("filename", ("e87dcea89a8c64b4", "9e15724760b5dc0f"), "b050c47cb15d8cdb"),
    f"{_CALLBACKS}.tensorboard:TensorBoard": ("log_dir", "86c06d8325cd7a96", "36b4c489a66848e9"),
}


def _redirecting_set_model(owner: str, attribute: str):
    def set_model(self, model):
        if strategies.is_ours(model.distribute_strategy):
            setattr(self, attribute, writable_path(getattr(self, attribute),
                                                   model.distribute_strategy))
        return original(resolve(owner), "set_model")(self, model)

    set_model.__qualname__ = f"{owner.rpartition(':')[2]}.set_model"
    return set_model


def _across_workers(callback, model) -> bool:
    strategy = model.distribute_strategy
    return strategies.is_ours(strategy) and is_multi_worker(strategy)


FIXES = tuple(
    Fix(
        issue="keras-team/keras#20585",
        affects=f"{owner.rpartition(':')[2]} across several workers",
        owner=owner,
        attribute="set_model",
        replacement=_redirecting_set_model(owner, attribute),
        refuses_when=_across_workers,
        relies_on={f"{owner}.__init__": init,  # sets the path attribute
                   f"{owner}.set_model": set_model},  # replaced (TensorBoard's reads it)
    )
    for owner, (attribute, init, set_model) in _PATH_ATTRIBUTES.items()
)
