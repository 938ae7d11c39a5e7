"""`check()`: does N-replica training equal 1-device training on the global batch?

Data-parallel training is only right when N replicas, each on B/N examples, end with the
weights one device reaches on all B examples: gradients averaged over the global batch,
loss scaled by the global batch size, batch norm synchronized. `check` trains the same
model both ways from the same initial weights on the same batches and compares, by
default in float64 so that float32 rounding cannot decide the verdict.
"""

from __future__ import annotations

import contextlib
import dataclasses

import keras
import tensorflow as tf

from strategykit.equivalence import added_terms, feeds, randomness, update_factor
from strategykit.equivalence import metric_differences as metrics
from strategykit.equivalence import weight_differences as differ
from strategykit.equivalence.arguments import (
    check_arguments,
    check_model_fn,
    check_options,
    check_run,
)
from strategykit.equivalence.precision import (
    cast_floats,
    cast_floats_of_dataset,
    cast_regularizers,
    global_dtype,
    other_dtype_layers,
)
from strategykit.equivalence.quiet import float64_quieted
from strategykit.equivalence.report import CheckReport
from strategykit.pinning.legacy_keras import check_not_keras_2
from strategykit.strategy.build import mirrored

__all__ = ["CheckReport", "check"]



def check(
    model_fn,
    data,
    replicas: int = 2,
    *,
    global_batch_size: int | None = None,
    steps: int = 3,
    epochs: int = 2,
    tolerance: float = 1e-5,
    strategy: tf.distribute.Strategy | None = None,
    dtype: str | None = "float64",
    gradient_accumulation_steps: int = 1,
) -> CheckReport:
    """Trains `model_fn()` on 1 device and on N replicas and compares weights and metrics.

    Both runs start from the same weights (the 1-device model's initial weights are
    copied into the distributed one) and see the same global batches in the same order,
    unshuffled, for `epochs` epochs, fed as `fit()` is fed: one device the arrays in
    batches of `global_batch_size`, N replicas `sk.shard` data of them (of a
    `tf.data.Dataset` given as `data`: `sk.shard` of that dataset itself, its size
    unknown where tf.data does not know it), sample weights included. Each epoch's last
    step is a partial batch for labeled data. The optimizers must have counted the same
    steps (`optimizer.iterations`, which Adam and learning-rate schedules read).
    `CheckReport.coverage` and the printed report say what was covered.
    When their weights agree, every value `fit()` reported must agree too (the loss and
    each metric, or what a custom `train_step` returns: a loss reported as 1/N of one
    device's is named as such), and both then evaluate the examples of the steps and
    half a global batch more (a partial final batch, padded on N replicas), and every
    value `evaluate()` returns, the loss and each compiled metric, must agree as well.

    **Random layers** (Dropout, GaussianNoise, the `Random*` augmentation layers: any
    layer holding a `keras.random.SeedGenerator`, in nested models and layers too) draw
    other numbers on N replicas than on one device, so both runs compute them as in
    inference (Dropout passes its inputs through); `CheckReport.random_layers` and the
    printed report name them. The rest of the model must be deterministic.

    **Why float64 by default.** A correct distributed run sums the same numbers in
    another order, so in float32 its weights differ from one device's by rounding, and
    a deep net at random initialization amplifies that from step to step: a ResNet50
    backbone with 44 synchronized batch norm layers ends 0.03 apart after 3 steps, as
    far as the same net on one device with and without XLA, and about as far as a real
    error (the same net with unsynchronized batch norm, 0.06). No float32 tolerance
    separates the two, and neither would one calibrated on a measured float32 noise
    floor: the noise is the size of the error. In float64 the rounding is 1e-16 instead
    of 1e-7: the correct run agrees within 1e-9 (2e-11 on that net) and the wrong one
    still differs by 0.06, so the default absolute tolerance of 1e-5 separates them by
    about four orders of magnitude on each side. So both models are built and trained
    under the global dtype policy `"float64"` with Keras's `floatx` set alike (so the
    compiled loss and the regularization terms are float64 too), and floating-point
    data is cast to float64; the user's policy (`mixed_float16` too) and `floatx` are
    restored afterwards, also when the check raises. TensorFlow's grappler remapper,
    which logs a `Not handling type DT_DOUBLE` line for every float64 op it could fuse,
    is off during a float64 check (`strategykit.equivalence.quiet`). It costs time
    (float64 is slower, and much slower on GPUs), not correctness: the check is about
    the distribution arithmetic, not about the precision used in production.

    Layers that pin their own dtype (`dtype="float32"`, a per-layer mixed policy, or
    every layer of a model loaded from a file or cloned from a model built *outside*
    `model_fn`, whose configs carry their dtype) keep it and their rounding; they are
    listed in `CheckReport.other_dtype_layers` and a warning. Weights pinned to another
    dtype than the rest of the model are an error: tf.distribute cannot all-reduce
    gradients of mixed dtypes. Build the model inside `model_fn` for a float64 check.
    The global policy is a process-wide setting: do not build other models in other
    threads during a check.

    Args:
        model_fn: a function without arguments returning a freshly built, compiled
            Keras 3 model, e.g. `lambda: build_model()`. It is called twice: once
            outside any strategy, once inside the N-replica scope, both times under
            the dtype policy `dtype`. A model itself is refused: its variables belong
            to the scope it was built in, and a copy would not be built in `dtype`.
        data: `(x, y)` or `(x, y, sample_weight)` numpy arrays (x a dict or list of
            arrays for several inputs), or the inputs alone for a model trained on `x`
            (an autoencoder's or a VAE's custom `train_step`): an array, a dict of
            arrays or `(x,)`. Or an unbatched `tf.data.Dataset` of such elements, of
            which the examples the check needs are read.
        replicas: replicas of the distributed run. Default 2.
        global_batch_size: examples per step of the distributed run over all replicas.
            Default: `4 * replicas`. Must be a multiple of `replicas`.
        steps: weight updates of each epoch. Default 3. With labeled data (and no
            accumulation) the last is a partial global batch, half of it real: padded
            with copies on N replicas, as at the end of most data.
        epochs: passes over those steps. Default 2: what happens at an epoch's end
            (Keras's end of the data, the next pass, the optimizer's step count carried
            on) is compared too. Pass 1 to halve the time of a check on a deep net.
        tolerance: largest absolute weight difference accepted, and largest difference
            of a value `fit()` or `evaluate()` reported (relative for a value larger
            than 1). Default 1e-5.
        strategy: the N-replica strategy to use. Default: `sk.mirrored(replicas=replicas)`.
        dtype: `"float64"` (default) to build and train both models in float64,
            `"float32"` for float32, or None to keep the user's global dtype policy.
            In a 16-bit policy (`mixed_bfloat16`, `mixed_float16`) rounding alone is
            larger than the tolerance: a failure with no cause found is reported
            `INCONCLUSIVE` (`CheckReport.inconclusive`), not blamed on a cause.
        gradient_accumulation_steps: K, an int >= 1. Default 1 (none). With K > 1 both
            models' optimizers accumulate gradients over K micro-steps of
            `global_batch_size` examples per update (fresh optimizers built from their
            config with Keras's `gradient_accumulation_steps=K`): N replicas x K
            micro-batches against 1 device x K micro-batches of the global batch. That
            is the one reference batch norm can match: it normalizes each micro-batch,
            over `global_batch_size` examples when synchronized, on both sides. For a
            model without batch-dependent layers it is also one step on the whole
            `K * global_batch_size` examples (tests/equivalence/test_check.py shows both). The
            optimizer in `model_fn` must not accumulate itself. Under a strategy not
            built by `sk.mirrored`/`sk.from_env`, Keras's accumulation fails
            (keras-team/keras#20582, fixed in `strategykit.upstream`).

    Returns:
        A `CheckReport`; true when the weights, what `fit()` reported and the metrics
        agree, and printable. `first_differing_log` names the first value `fit()`
        reported that differs, `first_differing_metric` the first metric `evaluate()`
        returned that differs. When the weights differ,
        `first_differing_layer` says where the difference starts: the first layer in
        forward order whose weights differ beyond `tolerance` after the first update,
        its forward state (moving statistics) looked at before its trainable weights,
        which backpropagation makes differ in every layer before a faulty one. When it
        failed, `differing_terms` names each layer whose `add_loss` term Keras counts
        otherwise on N replicas (a sum over the batch counts 1/N).

    Raises:
        ValueError: `model_fn` a model or anything but a function (a model is refused,
            not cloned: pass `lambda: build_model()`), `data` not arrays, `(x,)`,
            `(x, y)` or `(x, y, sample_weight)`, or a batched dataset, an invalid
            `dtype`, `gradient_accumulation_steps`, `steps`, `epochs`, `tolerance` or
            `strategy`,
            `global_batch_size` not a positive multiple of `replicas`, data holding
            fewer than `steps` updates' worth of examples, `model_fn` returning an
            uncompiled model, a Keras 2 (tf_keras) model, the same model twice, or one
            whose weights mix `dtype` and another dtype, or with K > 1 an optimizer
            that already accumulates gradients or is a `LossScaleOptimizer`.

    Example:
        >>> import keras, numpy as np, strategykit as sk
        >>> def model_fn():
        ...     keras.utils.set_random_seed(0)
        ...     model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        ...     model.compile("sgd", "mse")
        ...     return model
        >>> x = np.random.default_rng(0).normal(size=(48, 3)).astype("float32")
        >>> report = sk.check(model_fn, (x, x.sum(1)), replicas=2)  # doctest: +SKIP
        >>> report.passed, report.dtype  # doctest: +SKIP
        (True, 'float64')
        >>> report = sk.check(model_fn, (x, x.sum(1)), replicas=2,  # doctest: +SKIP
        ...                   gradient_accumulation_steps=2)
    """
    check_model_fn(model_fn)
    check_options(dtype, gradient_accumulation_steps)
    check_run(strategy, global_batch_size, steps, tolerance, epochs)
    strategy = strategy or mirrored(replicas=replicas)
    replicas = strategy.num_replicas_in_sync
    global_batch_size = global_batch_size or 4 * replicas
    accumulation = gradient_accumulation_steps
    trained_examples = steps * accumulation * global_batch_size
    dataset = data if isinstance(data, tf.data.Dataset) else None
    data = feeds.materialized(data, metrics.evaluation_size(trained_examples, global_batch_size))
    check_arguments(data, replicas, global_batch_size, steps, accumulation)
    data = cast_floats(data, dtype)
    partial = feeds.partial_final_batch(data, global_batch_size, accumulation)
    # each epoch's last batch partial; evaluated: the whole steps' examples and more
    trained_count = trained_examples - (global_batch_size - partial if partial else 0)
    trained = feeds.head(data, trained_count)
    # N replicas read a dataset as the user's fit() does: through sk.shard of the dataset
    replica_data = trained if dataset is None else feeds.dataset_head(
        cast_floats_of_dataset(dataset, dtype), trained_count)

    with global_dtype(dtype), float64_quieted(dtype):
        single = _prepared(model_fn, accumulation, dtype)
        random_layers = randomness.switch_off(single)
        other_dtypes = other_dtype_layers(single, dtype)
        initial_weights = single.get_weights()
        single_logs, single_first = _train(
            single, feeds.one_device(trained, global_batch_size), accumulation, epochs)
        # Inputs alone carry no weights to mark a padded batch's copies: whole batches
        evaluated = (metrics.evaluation_examples(data, trained_examples, global_batch_size)
                     if feeds.labeled(data) else trained)
        # Evaluated before model_fn runs again, which may free what this model holds:
        # keras.utils.set_random_seed clears TensorFlow's kernel cache, and a SentencePiece
        # tokenizer's model with it (keras-hub's DeBERTa, T5, Gemma, ALBERT)
        single_metrics = (metrics.evaluate_one_device(single, evaluated, global_batch_size)
                          if _evaluates(single) else {})
        with strategy.scope():
            distributed = _prepared(model_fn, accumulation, dtype, first=single)
        randomness.switch_off(distributed)
        distributed.set_weights(initial_weights)
        distributed_logs, distributed_first = _train(
            distributed, feeds.replicas(replica_data, strategy, global_batch_size),
            accumulation, epochs)
        final = differ.largest(differ.values(single), differ.values(distributed))
        optimizer_steps = (_optimizer_steps(single), _optimizer_steps(distributed))
        distributed_metrics = {}
        if (differ.agree(final, tolerance) and optimizer_steps[0] == optimizer_steps[1]
                and _evaluates(single)):
            distributed_metrics = metrics.evaluate_replicas(
                distributed, evaluated, strategy=strategy, global_batch_size=global_batch_size)
        else:  # the metrics then differ for that reason: not compared
            single_metrics = {}

    first_update = constant = None  # unseen when Keras skips batch callbacks
    if single_first and distributed_first:
        first_update = differ.largest(single_first, distributed_first)
        constant = update_factor.factor(initial_weights, single_first, distributed_first,
                                        [weight.trainable for weight in single.weights])
    first_layer, stage = differ.start(single, first_update, final, tolerance)
    report = CheckReport(
        replicas=replicas,
        global_batch_size=global_batch_size,
        steps=steps,
        tolerance=tolerance,
        epochs=epochs,
        partial_batch=partial,
        fed_dataset=dataset is not None,
        optimizer_steps=optimizer_steps,
        differences={w.path: difference for w, difference in zip(single.weights, final)},
        single_device_loss=single_logs.get("loss"),
        distributed_loss=distributed_logs.get("loss"),
        dtype=dtype,
        compute_dtype=(keras.config.dtype_policy().compute_dtype if dtype is None else dtype),
        gradient_accumulation_steps=accumulation,
        layer_differences=differ.by_layer(single, final),
        first_differing_layer=first_layer,
        first_difference_stage=stage,
        other_dtype_layers=other_dtypes,
        single_device_metrics=single_metrics,
        distributed_metrics=distributed_metrics,
        single_device_logs=single_logs,
        distributed_logs=distributed_logs,
        random_layers=random_layers,
        update_factor=constant,
    )
    if report.passed:
        return report
    if (constant is None and not report.weights_agree and report.optimizer_steps_agree
            and not isinstance(single.optimizer, keras.optimizers.SGD)):
        with global_dtype(dtype), float64_quieted(dtype):
            constant = _sgd_update_factor(model_fn, strategy, feeds.head(
                trained, global_batch_size), global_batch_size, initial_weights, dtype)
        report = dataclasses.replace(report, update_factor=constant)
    with global_dtype(dtype), float64_quieted(dtype):  # which layer's added term differs
        inputs = feeds.unpack(metrics.evaluation_examples(data, trained_examples,
                                                          global_batch_size))[0]
        terms = added_terms.differing_terms(single, distributed, strategy, inputs,
                                            global_batch_size, initial_weights, tolerance)
    return dataclasses.replace(report, differing_terms=tuple(terms))


def _sgd_update_factor(model_fn, strategy, batch, global_batch_size, initial_weights,
                       dtype) -> float | None:
    """The factor of N replicas' first update to one device's, both trained by SGD.

    An adaptive optimizer (Adam, its first step the sign of the gradient) hides a
    gradient N times one device's (keras.io's VAE on N replicas): so a failed check
    whose first updates are not parallel trains one more step of each model with
    `keras.optimizers.SGD` (replaced, not recompiled) from the same weights, where the
    update is the gradient, and compares those."""
    updates = []
    for scope in (None, strategy):
        with scope.scope() if scope is not None else contextlib.nullcontext():
            model = _prepared(model_fn, 1, dtype)
            randomness.switch_off(model)
            model.optimizer = keras.optimizers.SGD(0.01)
        model.set_weights(initial_weights)
        feed = (feeds.one_device(batch, global_batch_size) if scope is None
                else feeds.replicas(batch, strategy, global_batch_size))
        model.fit(**feed, epochs=1, verbose=0, shuffle=False)
        updates.append(model)
    single, distributed = updates
    return update_factor.factor(initial_weights, single.get_weights(),
                                distributed.get_weights(),
                                [weight.trainable for weight in single.weights])


def _optimizer_steps(model: keras.Model) -> int:
    """The steps the model's optimizer counted (its `iterations`)."""
    return int(keras.ops.convert_to_numpy(model.optimizer.iterations))


def _evaluates(model: keras.Model) -> bool:
    """Whether `evaluate()` computes something: a compiled loss or a `test_step` of its
    own (keras.io's VAE has neither: its `train_step` computes its loss)."""
    return model.loss is not None or type(model).test_step is not keras.Model.test_step


def _train(model: keras.Model, feed: dict, first_update: int, epochs: int):
    """`epochs` passes over the batches of `feed` (arguments of `fit()`), in order.

    Returns:
        What `fit()` reported in the last epoch (its History's values, by name), and the
        weights after the first `first_update` batches.
    """
    after_first_update = []

    def snapshot(batch, logs=None):
        if batch == first_update - 1 and not after_first_update:
            after_first_update.extend(differ.values(model))

    history = model.fit(**feed, epochs=epochs, verbose=0, shuffle=False, callbacks=[
        keras.callbacks.LambdaCallback(on_train_batch_end=snapshot)])
    return metrics.floats(history.history), after_first_update


def _prepared(model_fn, accumulation: int, dtype: str | None, first=None) -> keras.Model:
    """`model_fn()`, checked (a model other than `first`), its optimizer accumulating,
    its regularizers in `dtype`."""
    model = _accumulating(_compiled(model_fn, first), accumulation)
    cast_regularizers(model, dtype)
    return model


def _compiled(model_fn, first=None) -> keras.Model:
    model = model_fn()
    check_not_keras_2(model, "model_fn()")
    if model is first:
        raise ValueError(
            "model_fn returned the same model object twice; sk.check needs a fresh model "
            "for each run, the second built inside the N-replica strategy's scope. "
            f"Received: model_fn returning the model {model.name!r} each call. Build, "
            "compile and return a new model inside model_fn, e.g. sk.check(lambda: "
            "build_model(), data)."
        )
    if not isinstance(model, keras.Model) or not model.compiled:
        raise ValueError(
            f"model_fn must return a compiled Keras model. Received: model_fn() returned "
            f"{_a(type(model).__name__)}"
            f"{'' if not isinstance(model, keras.Model) else ' model (not compiled)'}. Call "
            "model.compile(optimizer, loss) inside model_fn before returning the model."
        )
    return model


def _a(noun: str) -> str:
    return f"{'an' if noun[0].lower() in 'aeiou' else 'a'} {noun}"


def _accumulating(model: keras.Model, steps: int) -> keras.Model:
    """`model`, its optimizer replaced by one configured alike that accumulates over
    `steps` micro-steps (nothing changes for 1). Replaced, not recompiled: the loss, loss
    weights and metrics stay as compiled. Built in the caller's scope, so its variables
    belong to the caller's strategy."""
    _check_optimizer(model.optimizer, steps)
    if steps > 1:
        config = {**model.optimizer.get_config(), "gradient_accumulation_steps": steps}
        model.optimizer = type(model.optimizer).from_config(config)
    return model


def _check_optimizer(optimizer, accumulation: int) -> None:
    if accumulation == 1:
        return
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        raise ValueError(
            "sk.check cannot add gradient accumulation to a LossScaleOptimizer. Received: "
            f"gradient_accumulation_steps={accumulation} with {optimizer.name!r}. Compile "
            "with the inner optimizer: in float64 (sk.check's default dtype) loss scaling "
            "is not needed."
        )
    if optimizer.gradient_accumulation_steps:
        raise ValueError(
            f"model_fn's optimizer already accumulates gradients (gradient_accumulation_"
            f"steps={optimizer.gradient_accumulation_steps}), and sk.check sets its own "
            f"on both runs. Received: gradient_accumulation_steps={accumulation}. Build the "
            "optimizer without gradient_accumulation_steps and pass it to sk.check."
        )
