"""keras-hub's models on `sk.shard` data: their preprocessor inside the input pipeline.

keras-hub's `Task` models (`ResNetImageClassifier`, `BertTextClassifier`,
`GPT2CausalLM`, ...) are `PipelineModel`s: their `fit()`, `evaluate()` and `predict()`
turn `x` into a `tf.data.Dataset` and map the model's `preprocess_samples` (its
preprocessor: a tokenizer, an image converter, or nothing) over its batches before
handing it to Keras. A distributed dataset is no `tf.data.Dataset` and has no `map`:
`tf.data.Dataset.from_tensor_slices` of one raises `AttributeError:
'DistributedDatasetSpec' object has no attribute '_to_batched_tensor_list'`, for every
Task model, with or without a preprocessor. keras-team/keras-hub (unreported); keras-hub
0.16.1 to 0.32.0 all do this (two versions of the code: 0.32.0 adds grain datasets).

For `sk.shard` data these methods do what keras-hub's do, with the preprocessing moved
into the data's input pipeline (`strategykit.made.remade_data`): the data is remade
with `preprocess_samples` run on every batch before its weights and its padding, so each
replica gets its own examples, preprocessed as one device's batches are, and a padded
final batch stays exact also where the preprocessor makes the labels and weights (a
causal LM's next tokens and padding mask). The remade data goes to Keras's own
`fit()`/`evaluate()`/`predict()`. `validation_data` beside `sk.shard` training data
must be `sk.shard` data too (other data is refused, naming the fix), and `sk.shard`
validation data beside other training data is refused. `CausalLM.generate()` given
`sk.shard` data (its preprocessor tokenized the distributed dataset: "Input should be a
string") refuses before anything runs, naming the fix: the prompts themselves (keras-hub
generates batch by batch, not split over replicas).
Every other call goes to keras-hub's own code unchanged.

The fixes wait for keras-hub: strategykit does not import it (`Fix.package`), and
installs them right after the program does.
"""

from __future__ import annotations

import keras

from strategykit.made.remade_data import options_of, remaker_of
from strategykit.pinning.fix import Fix, original, resolve

_PIPELINE_MODEL = "keras_hub.src.utils.pipeline_model:PipelineModel"
_CAUSAL_LM = "keras_hub.src.models.causal_lm:CausalLM"


def _sharded(data) -> bool:
    return remaker_of(data) is not None


def _preprocessed(model, data):
    """`sk.shard` data remade with `model`'s preprocessing in its input pipeline (as it
    is when it was remade so already)."""
    if "preprocess" in options_of(data):
        return data
    return remaker_of(data)(preprocess=model.preprocess_samples)


def _refuse_arrays_beside(method: str, **given) -> None:
    """Keras's rule for a dataset `x`: no `y`, `sample_weight`, `batch_size` beside it."""
    for name, value in given.items():
        if value is None:
            continue
        fix = ("Split off a validation set and pass validation_data=sk.shard((x_val, "
               "y_val), strategy, global_batch_size=...)" if name == "validation_split"
               else "Pass it to sk.shard (sk.shard((x, y, sample_weight), strategy, "
               "global_batch_size=...)) and leave it out here")
        raise ValueError(
            f"{method}() of a keras-hub model on sk.shard data takes no {name}: the data "
            f"is batched already. Received: {name} of type {type(value).__name__}. {fix}.")


def _validation(model, validation_data):
    if validation_data is None:
        return None
    if _sharded(validation_data):
        return _preprocessed(model, validation_data)
    raise ValueError(
        "fit() of a keras-hub model on sk.shard data takes validation_data as sk.shard "
        "data too, preprocessed in its own input pipeline. Received: validation_data of "
        f"type {type(validation_data).__name__}. Pass validation_data=sk.shard((x_val, "
        "y_val), strategy, global_batch_size=...).")


def _fit(self, x=None, y=None, batch_size=None, sample_weight=None, validation_data=None,
         validation_split=None, **kwargs):
    """keras-hub's `PipelineModel.fit`; `sk.shard` data is preprocessed in its pipeline."""
    if not _sharded(x):
        if _sharded(validation_data):
            raise ValueError(
                "fit() of a keras-hub model takes sk.shard validation_data only beside "
                f"sk.shard training data. Received: x of type {type(x).__name__}. Pass "
                "x=sk.shard((x, y), strategy, global_batch_size=...) too.")
        return original(resolve(_PIPELINE_MODEL), "fit")(
            self, x, y, batch_size, sample_weight, validation_data, validation_split,
            **kwargs)
    _refuse_arrays_beside("fit", y=y, sample_weight=sample_weight, batch_size=batch_size,
                          validation_split=validation_split)
    # sk.shard shuffles (or not) itself; Keras ignores `shuffle` for a dataset, and from
    # 3.15 warns of its default True on every call.
    kwargs.setdefault("shuffle", False)
    return keras.Model.fit(self, x=_preprocessed(self, x),
                           validation_data=_validation(self, validation_data), **kwargs)


def _evaluate(self, x=None, y=None, batch_size=None, sample_weight=None, **kwargs):
    """keras-hub's `PipelineModel.evaluate`; `sk.shard` data is preprocessed in its
    pipeline (fit()'s validation data already is: Keras reads its cached iterator)."""
    if not _sharded(x):
        return original(resolve(_PIPELINE_MODEL), "evaluate")(
            self, x, y, batch_size, sample_weight, **kwargs)
    _refuse_arrays_beside("evaluate", y=y, sample_weight=sample_weight,
                          batch_size=batch_size)
    return keras.Model.evaluate(self, x=_preprocessed(self, x), **kwargs)


def _predict(self, x=None, batch_size=None, **kwargs):
    """keras-hub's `PipelineModel.predict`; `sk.shard` data is preprocessed in its
    pipeline (one row per example, in order, as for any model: `exact_predictions`)."""
    if not _sharded(x):
        return original(resolve(_PIPELINE_MODEL), "predict")(self, x, batch_size, **kwargs)
    _refuse_arrays_beside("predict", batch_size=batch_size)
    return keras.Model.predict(self, x=_preprocessed(self, x), **kwargs)


def _generate(self, inputs, *args, **kwargs):
    """keras-hub's `CausalLM.generate`; `sk.shard` data is refused, naming the fix."""
    if _sharded(inputs):
        raise ValueError(
            "generate() of a keras-hub model takes the prompts themselves, not sk.shard "
            "data: its preprocessor tokenizes strings, and generate() does not split its "
            f"batches over replicas. Received: inputs of type {type(inputs).__name__} "
            "(sk.shard data). Pass the prompts: model.generate(prompts), a string, a list "
            "of strings, or a batched tf.data.Dataset of them.")
    return original(resolve(_CAUSAL_LM), "generate")(self, inputs, *args, **kwargs)


def _on_sharded_data(model, x=None, *args, validation_data=None, **kwargs) -> bool:
    return _sharded(x) or _sharded(validation_data)


def _fix(attribute: str, replacement, fingerprints: tuple, owner=_PIPELINE_MODEL) -> Fix:
    return Fix(
        issue="keras-team/keras-hub (unreported)",
        affects="keras-hub models on sk.shard data",
        owner=owner,
        attribute=attribute,
        replacement=replacement,
        relies_on={
            # replaced: maps preprocess_samples over the batches of x, then Keras's own
            # (0.16.1 to 0.31.1; 0.32.0, which adds grain datasets); generate: hands its
            # inputs to the preprocessor as one batch of prompts
            f"{owner}.{attribute}": fingerprints,
        },
        refuses_when=_on_sharded_data,
        package="keras_hub",
    )


FIXES = (
    _fix("fit", _fit, ("cf5f8c20b09000e7", "fc3edaa1ca4fd5df")),
    _fix("evaluate", _evaluate, ("4e0a3a8844cc36f8", "7b46944a88f6f20e")),
    _fix("predict", _predict, ("bafa936cc53051b1", "b8bfea9c93e98762")),
    _fix("generate", _generate, (  # 0.18.0 to 0.18.1, 0.19.0 to 0.29.0, to 0.30.0, on
        "690a63cd0ec16f0f", "1e2b4ffbf8d2854b", "a44eac6824af370e", "36dd3bb2f1c96270"),
        owner=_CAUSAL_LM),
)
