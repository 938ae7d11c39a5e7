"""Two runs of one model compared weight by weight and layer by layer, for `sk.check`.

Where two training runs start to differ is found from the weights after the first
update, when both runs have made exactly one forward and one backward pass from the
same weights:

- A layer that computes differently in the forward pass (batch norm on a replica's
  slice instead of the global batch) changes its own forward state, the non-trainable
  weights such as moving statistics, and that of every layer after it. The first layer
  whose non-trainable weights differ is where the forward pass first differs.
- Every trainable weight differs after one update as soon as any gradient does:
  backpropagation carries a difference to every layer before the one that caused it.
  So trainable weights only name a layer when the forward state agrees (a difference
  in the gradients themselves, e.g. loss scaled by the per-replica batch): then the
  first trainable layer.
"""

from __future__ import annotations

import keras
import numpy as np

from strategykit.batchnorm.nested_layers import flat_layers

FORWARD = "forward"
"""The forward pass differs first: non-trainable state differs after one update."""
GRADIENTS = "gradients"
"""The forward state agrees after one update; the trainable weights do not."""
LATER = "later"
"""Nothing differs after one update; the first layer that differs at the end."""


def agree(differences, tolerance: float) -> bool:
    """Whether no weight differs by more than `tolerance` (absolute differences)."""
    return max(differences, default=0.0) <= tolerance


def values(model: keras.Model) -> list[np.ndarray]:
    """A copy of every weight of `model`, in `model.weights` order."""
    return [np.array(weight) for weight in model.weights]


def largest(a: list[np.ndarray], b: list[np.ndarray]) -> list[float]:
    """The largest absolute difference of each pair of weights.

    Raises:
        ValueError: the two lists do not hold weights of the same shapes.
    """
    if [w.shape for w in a] != [w.shape for w in b]:
        raise ValueError(
            f"model_fn built two different models: {len(a)} weights on one device, "
            f"{len(b)} in the strategy's scope (or other shapes). Received a model_fn "
            "whose model depends on the strategy or on state. Make model_fn build the "
            "same model on every call."
        )
    return [float(np.max(np.abs(x - y), initial=0.0)) for x, y in zip(a, b)]


def by_layer(model: keras.Model, differences: list[float], *, trainable=None) -> dict:
    """The largest difference per layer with weights, in forward order.

    Args:
        model: the model whose `weights` `differences` follows.
        differences: one difference per weight of `model.weights`.
        trainable: None (default) for every weight, True or False for only the
            trainable or non-trainable ones.
    """
    index = {id(weight): i for i, weight in enumerate(model.weights)}
    result = {}
    for name, layer in flat_layers(model):
        weights = {None: layer.weights, True: layer.trainable_weights,
                   False: layer.non_trainable_weights}[trainable]
        found = [differences[index[id(w)]] for w in weights if id(w) in index]
        if found:
            result[name] = max(found)
    return result


def start(model: keras.Model, after_first_update: list[float] | None, final: list[float],
          tolerance: float) -> tuple[str | None, str | None]:
    """Where the difference starts: `(layer name, FORWARD | GRADIENTS | LATER)`.

    `(None, None)` when no weight differs beyond `tolerance` at the end. Without the
    differences after the first update (None), the first layer that differs at the end.
    """
    final_layers = by_layer(model, final)
    if max(final_layers.values(), default=0.0) <= tolerance:
        return None, None
    for trainable, stage in ((False, FORWARD), (True, GRADIENTS)):
        if after_first_update is not None:
            first = _first_beyond(
                by_layer(model, after_first_update, trainable=trainable), tolerance)
            if first is not None:
                return first, stage
    return _first_beyond(final_layers, tolerance), LATER


def _first_beyond(layer_differences: dict, tolerance: float) -> str | None:
    return next((name for name, difference in layer_differences.items()
                 if difference > tolerance), None)
