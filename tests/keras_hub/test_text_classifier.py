"""keras-hub's text classifier on 4 replicas of sk.shard data equals one device.

A `BertTextClassifier` built from a tiny config (no download), fed token dicts (no
preprocessor) and raw strings through its own preprocessor (a `BertTokenizer` from a
small vocabulary): `fit()` (for strings also with validation, then `evaluate()` and
`predict()`) on 37 examples (a final batch of 5, padded) against one device on the same global
batches, float64.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import strategykit as sk

from conftest import assert_same_as_one_device, cpu_devices

keras_hub = pytest.importorskip("keras_hub")

TRAIN, VALIDATION, GLOBAL_BATCH, LENGTH = 37, 21, 16, 8
WORDS = ["the", "a", "cat", "dog", "sat", "ran", "on", "mat", "fast", "slow", "red", "big"]
VOCABULARY = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]


def _classifier(strategy, with_preprocessor: bool):
    with strategy.scope():
        keras.utils.set_random_seed(0)
        backbone = keras_hub.models.BertBackbone(
            vocabulary_size=len(VOCABULARY), num_layers=1, num_heads=2, hidden_dim=8,
            intermediate_dim=16, max_sequence_length=LENGTH, dropout=0.0)
        preprocessor = keras_hub.models.BertTextClassifierPreprocessor(
            keras_hub.tokenizers.BertTokenizer(vocabulary=VOCABULARY),
            sequence_length=LENGTH) if with_preprocessor else None
        model = keras_hub.models.BertTextClassifier(
            backbone, num_classes=2, preprocessor=preprocessor, dropout=0.0)
        model.compile(optimizer=keras.optimizers.Adam(1e-2), weighted_metrics=["accuracy"])
    return model


def _sentences(examples, seed):
    rng = np.random.default_rng(seed)
    text = np.array([" ".join(rng.choice(WORDS, rng.integers(2, 9))) for _ in range(examples)])
    return text, rng.integers(0, 2, examples)


def _tokens(text):
    """What the classifier's preprocessor makes of `text`, as token dicts."""
    preprocessor = keras_hub.models.BertTextClassifierPreprocessor(
        keras_hub.tokenizers.BertTokenizer(vocabulary=VOCABULARY), sequence_length=LENGTH)
    return {name: np.asarray(value) for name, value in preprocessor(tf.constant(text)).items()}


def _run(strategy, inputs, sharded: bool):
    model = _classifier(strategy, with_preprocessor=inputs == "strings")
    (x, y), (vx, vy) = _sentences(TRAIN, 1), _sentences(VALIDATION, 2)
    if inputs == "tokens":
        x, vx = _tokens(x), _tokens(vx)
    if sharded:
        train = {"x": sk.shard((x, y), strategy, global_batch_size=GLOBAL_BATCH)}
        validation = sk.shard((vx, vy), strategy, global_batch_size=GLOBAL_BATCH)
        test, features = validation, sk.shard(vx, strategy, global_batch_size=GLOBAL_BATCH)
    else:
        train = {"x": x, "y": y, "batch_size": GLOBAL_BATCH, "shuffle": False}
        validation, test, features = (vx, vy), {"x": vx, "y": vy}, vx
    if inputs == "tokens":  # fit() alone: the other calls' paths are the same for strings
        return model, model.fit(**train, epochs=1, verbose=0).history, {}, None
    history = model.fit(**train, validation_data=validation, epochs=1, verbose=0).history
    test = test if isinstance(test, dict) else {"x": test}
    evaluated = model.evaluate(**test, batch_size=None if sharded else GLOBAL_BATCH,
                               return_dict=True, verbose=0)
    predicted = model.predict(features, batch_size=None if sharded else GLOBAL_BATCH,
                              verbose=0)
    return model, history, evaluated, predicted


@pytest.mark.parametrize("inputs", ["tokens", "strings"])
def test_a_text_classifier_on_four_replicas_equals_one_device(float64, inputs):
    one, one_history, one_evaluated, one_predicted = _run(
        tf.distribute.get_strategy(), inputs, sharded=False)
    model, history, evaluated, predicted = _run(sk.mirrored(cpu_devices(4)), inputs,
                                                sharded=True)
    assert_same_as_one_device(model, one, history, one_history)
    assert_same_as_one_device(model, one, evaluated, one_evaluated)
    if inputs == "strings":  # predict()'s path is the same for token dicts
        assert predicted.shape == (VALIDATION, 2)
        np.testing.assert_allclose(predicted, one_predicted, rtol=0, atol=1e-10)
