"""keras-team/keras (unreported): sparse gradients of shared indices, summed across replicas.

An `Embedding` (any `gather`) gives an `IndexedSlices` gradient: one slice per index
looked up. Keras's optimizers update their state from the slices as they are, and the
stateful ones are not linear in them: Adam's second moment adds `square(slice)` for each
slice, so two slices of one row count `a**2 + b**2` where one slice of their sum counts
`(a + b)**2` (Adagrad, RMSprop, Adadelta, Adamax, Nadam, AdamW, Ftrl, Lion, LAMB,
Adafactor likewise; SGD is linear and exact either way).
`TFOptimizer._all_reduce_sum_gradients` all-reduces every gradient with
`ReplicaContext.all_reduce(SUM, ...)`, which for an `IndexedSlices` concatenates the
replicas' slices. That equals one device's slices where each slice belongs to one
example (a token embedding: the global batch's lookups, in order), but not where every
replica looks up the same indices for all its examples (a position embedding,
`Embedding(maxlen, d)(ops.arange(maxlen))` broadcast over the batch, as keras.io's
Transformer examples do): one device has one slice per position, summed over the global
batch; N replicas have N slices per position, each summed over its own examples. Adam on
4 replicas then ends 1e-3 away from one device in float64 after 4 steps; raw
`tf.distribute.MirroredStrategy` does the same (it is where the sum happens).

The fix replaces `_all_reduce_sum_gradients`: an `IndexedSlices` whose indices are the
same on every replica, because they depend on no data (only on constants and static
shapes, read from the traced graph: `shared_indices`), has its values all-reduced
densely, in the same all-reduce as the other gradients, and keeps its indices: each
slice is one device's. Every other gradient is reduced as Keras reduces it. Only under a
strategy of several replicas with a sparse gradient; otherwise Keras's own code runs.
The replicas' concatenated slices also get back the static shape of their rows, which
TensorFlow 2.18's all-reduce loses: Keras 3.8's Adagrad, RMSprop and Adafactor fail
on the concatenation without it (`Cannot convert a partially known TensorShape`).

Not covered, as one device's slices cannot be known there: indices that depend on the
data only through a shape not known when the step is traced (a sequence length of
`None`: `ops.arange(ops.shape(x)[1])`), and one variable looked up both per example and
with shared indices (tied token and position tables): these concatenate, as upstream.
TensorFlow's collective all-reduce concatenates gradients into one tensor, which fails
for gradients of several dtypes (`ConcatV2` of float32 and float64: Keras's float32 LoRA
kernels in a float64 model) under any strategy; under those strategykit made or sharded
for they are reduced one dtype at a time.
Checked on Keras 3.8.0 to 3.15.1 with TensorFlow 2.18.1 to 2.21.0.
"""

from __future__ import annotations

import tensorflow as tf

from strategykit.made import strategies
from strategykit.pinning.fix import Fix, original, resolve

_TF_OPTIMIZER = "keras.src.backend.tensorflow.optimizer:TFOptimizer"

# Deterministic, stateless ops whose outputs depend on their inputs only: indices made of
# these and constants are the same on every replica.
_PURE_OPS = frozenset({
    "Abs", "Add", "AddV2", "BroadcastTo", "Cast", "ConcatV2", "Cumsum", "Equal",
    "ExpandDims", "Fill", "FloorDiv", "FloorMod", "GatherV2", "Greater", "GreaterEqual",
    "Identity", "Less", "LessEqual", "LogicalAnd", "LogicalNot", "LogicalOr", "Max",
    "Maximum", "Min", "Minimum", "Mul", "Neg", "NotEqual", "OnesLike", "Pack", "Prod",
    "Range", "Reshape", "Select", "SelectV2", "Slice", "Squeeze", "StopGradient",
    "StridedSlice", "Sub", "Sum", "Tile", "Transpose", "Unique", "Unpack", "ZerosLike",
})
_SHAPE_OPS = frozenset({"Shape", "ShapeN", "Size", "Rank"})


def shared_indices(indices) -> bool:
    """Whether `indices` (a tensor of a traced step) is the same on every replica: made
    only of constants, static shapes and pure ops, depending on no data, variable or
    random op. False where that cannot be read from the graph (eager tensors included).

    Example:
        >>> import tensorflow as tf
        >>> @tf.function
        ... def positions_and_tokens(tokens):
        ...     return (shared_indices(tf.range(5) + 1), shared_indices(tokens + 1))
        >>> [bool(b) for b in positions_and_tokens(tf.constant([3, 4]))]
        [True, False]
    """
    if not hasattr(indices, "op") or tf.executing_eagerly():
        return False
    seen, pending = set(), [indices.op]
    while pending:
        op = pending.pop()
        if op.name in seen:
            continue
        seen.add(op.name)
        if op.type == "Const":
            continue
        if op.type in _SHAPE_OPS:
            if not all(tensor.shape.is_fully_defined() for tensor in op.inputs):
                return False
            continue
        if op.type not in _PURE_OPS:
            return False
        pending.extend(tensor.op for tensor in op.inputs)
    return True


def _shared_positions(grads_and_vars) -> list[int]:
    """Where `grads_and_vars` holds an `IndexedSlices` of shared indices."""
    return [i for i, (grad, _) in enumerate(grads_and_vars)
            if isinstance(grad, tf.IndexedSlices) and shared_indices(grad.indices)]


def _applies(optimizer, grads_and_vars) -> bool:
    """Several replicas of a strategy of strategykit's, in a replica context, and a
    sparse gradient."""
    context = tf.distribute.get_replica_context()
    return bool(strategies.in_ours() and context is not None
                and context.num_replicas_in_sync > 1
                and any(isinstance(grad, tf.IndexedSlices) for grad, _ in grads_and_vars))


def _all_reduce_sum_gradients(self, grads_and_vars):
    """Keras's all-reduce, with the values of shared-index slices summed densely."""
    grads_and_vars = list(grads_and_vars)
    reduce = _each_dtype_apart(original(resolve(_TF_OPTIMIZER), "_all_reduce_sum_gradients"))
    if not _applies(self, grads_and_vars):
        return reduce(self, grads_and_vars)
    shared = _shared_positions(grads_and_vars)
    dense = [(grad.values, var) if i in shared else (grad, var)
             for i, (grad, var) in enumerate(grads_and_vars)]
    reduced = reduce(self, dense)
    return [(_slices_like(grads_and_vars[i][0], reduced_grad, summed=i in shared), var)
            if isinstance(grads_and_vars[i][0], tf.IndexedSlices) else (reduced_grad, var)
            for i, (reduced_grad, var) in enumerate(reduced)]


def _each_dtype_apart(reduce):
    """`reduce`, called once per gradient dtype where there are several: TensorFlow's
    collective all-reduce concatenates a list into one tensor and fails on mixed dtypes
    (`ConcatV2 ... float32, float64`: Keras's float32 LoRA kernels in a float64 model)."""
    def reduced(optimizer, grads_and_vars):
        dtypes = list(dict.fromkeys(g.dtype for g, _ in grads_and_vars if g is not None))
        if (len(dtypes) < 2 or tf.distribute.get_replica_context() is None
                or not strategies.in_ours()):
            return reduce(optimizer, grads_and_vars)
        result = list(grads_and_vars)
        for dtype in dtypes:
            where = [i for i, (g, _) in enumerate(grads_and_vars)
                     if g is not None and g.dtype == dtype]
            for i, pair in zip(where, reduce(optimizer, [grads_and_vars[i] for i in where])):
                result[i] = pair
        return result
    return reduced


def _slices_like(slices: tf.IndexedSlices, reduced, *, summed: bool) -> tf.IndexedSlices:
    """The all-reduced gradient of `slices` (`reduced`: its values summed densely, or
    the replicas' slices concatenated) with the static shape of its values' rows: the
    all-reduce of TensorFlow 2.18 loses it, and Keras 3.8's sparse ops (Adagrad, RMSprop,
    Adafactor) fail without it."""
    if not summed and not isinstance(reduced, tf.IndexedSlices):
        return reduced  # densified by the all-reduce: its shape is known
    values = tf.identity(reduced if summed else reduced.values)
    values.set_shape(slices.values.shape if summed else [None, *slices.values.shape[1:]])
    if summed:
        return tf.IndexedSlices(values, slices.indices, slices.dense_shape)
    return tf.IndexedSlices(values, reduced.indices, reduced.dense_shape)


FIXES = (
    Fix(
        issue="keras-team/keras (unreported)",
        affects=("sparse gradients (an Embedding's) with a stateful optimizer under "
                 "several replicas"),
        owner=_TF_OPTIMIZER,
        attribute="_all_reduce_sum_gradients",
        replacement=_all_reduce_sum_gradients,
        relies_on={
            # replaced, called for the reduction: returns (reduced, var) in order, Nones kept
            f"{_TF_OPTIMIZER}._all_reduce_sum_gradients": (
                "953512efa56c9680",  # 3.14.0 to 3.15.1 (an error for an assert)
                "dd8896fa68d79501"),  # 3.8.0 to 3.13.2
            # calls it with (IndexedSlices, variable) pairs, then updates per replica
            f"{_TF_OPTIMIZER}._backend_update_step": "00bd759c099a6b72",
        },
        refuses_when=_applies,
    ),
)
