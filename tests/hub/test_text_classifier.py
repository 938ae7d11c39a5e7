"""keras-hub's text classifier on 2 replicas of sk.shard data equals one device.

A `BertTextClassifier` built from a tiny config (no download) with its own preprocessor
(a `BertTokenizer` from a small vocabulary), fed raw strings: `fit()` with validation
data, `evaluate()` and `predict()`; then, its preprocessor set to None (keras-hub's way to
preprocess yourself), fed token dicts: `fit()` again. 21 examples (a full batch, then a
final batch of 5, padded: 3 and 2 real examples on the replicas) against one device
on the same global batches, float64. One model both ways: the token dicts reuse its
traced train step. The one-device model runs eagerly: the same computation as its
traced steps, without tracing them (the replicas' steps are traced as usual). 2
replicas, as in the other keras-hub tests: each replica traces the steps once, so 4 would
double the CPU of these tests, and 2 already give each replica its own examples and pad
the final batch unevenly.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import strategykit as sk

from conftest import assert_same_as_one_device, cpu_devices, reference_runs_eagerly

keras_hub = pytest.importorskip("keras_hub")

TRAIN, VALIDATION, GLOBAL_BATCH, LENGTH, REPLICAS = 21, 21, 16, 8, 2
WORDS = ["the", "a", "cat", "dog", "sat", "ran", "on", "mat", "fast", "slow", "red", "big"]
VOCABULARY = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]


def _classifier(strategy):
    with strategy.scope():
        keras.utils.set_random_seed(0)
        backbone = keras_hub.models.BertBackbone(
            vocabulary_size=len(VOCABULARY), num_layers=1, num_heads=2, hidden_dim=8,
            intermediate_dim=16, max_sequence_length=LENGTH, dropout=0.0)
        preprocessor = keras_hub.models.BertTextClassifierPreprocessor(
            keras_hub.tokenizers.BertTokenizer(vocabulary=VOCABULARY), sequence_length=LENGTH)
        model = keras_hub.models.BertTextClassifier(
            backbone, num_classes=2, preprocessor=preprocessor, dropout=0.0)
        # keras-hub's recipes: AdamW, the global gradient clipped (0.1: small enough to act)
        model.compile(optimizer=keras.optimizers.AdamW(1e-2, global_clipnorm=0.1),
                      weighted_metrics=["accuracy"], run_eagerly=reference_runs_eagerly())
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


def _on_strings(model, strategy, sharded: bool):
    """fit() with validation data, evaluate() and predict() on raw strings."""
    (x, y), (vx, vy) = _sentences(TRAIN, 1), _sentences(VALIDATION, 2)
    if sharded:
        validation = sk.shard((vx, vy), strategy, global_batch_size=GLOBAL_BATCH)
        history = model.fit(sk.shard((x, y), strategy, global_batch_size=GLOBAL_BATCH),
                             validation_data=validation, epochs=1, verbose=0).history
        evaluated = model.evaluate(validation, return_dict=True, verbose=0)
        predicted = model.predict(sk.shard(vx, strategy, global_batch_size=GLOBAL_BATCH),
                                  verbose=0)
    else:
        history = model.fit(x, y, batch_size=GLOBAL_BATCH, shuffle=False,
                            validation_data=(vx, vy), epochs=1, verbose=0).history
        evaluated = model.evaluate(vx, vy, batch_size=GLOBAL_BATCH, return_dict=True,
                                   verbose=0)
        predicted = model.predict(vx, batch_size=GLOBAL_BATCH, verbose=0)
    return history, evaluated, predicted


def _on_tokens(model, strategy, sharded: bool):
    """fit() on token dicts, the model's preprocessor set to None."""
    model.preprocessor = None
    text, y = _sentences(TRAIN, 3)
    x = _tokens(text)
    if sharded:
        return model.fit(sk.shard((x, y), strategy, global_batch_size=GLOBAL_BATCH),
                         epochs=1, verbose=0).history
    return model.fit(x, y, batch_size=GLOBAL_BATCH, shuffle=False, epochs=1,
                     verbose=0).history


@pytest.mark.slow
def test_a_text_classifier_on_two_replicas_equals_one_device(float64):
    one_device, strategy = tf.distribute.get_strategy(), sk.mirrored(cpu_devices(REPLICAS))
    one, model = _classifier(one_device), _classifier(strategy)

    one_history, one_evaluated, one_predicted = _on_strings(one, one_device, sharded=False)
    history, evaluated, predicted = _on_strings(model, strategy, sharded=True)
    assert_same_as_one_device(model, one, history, one_history)
    assert_same_as_one_device(model, one, evaluated, one_evaluated)
    assert predicted.shape == (VALIDATION, 2)
    np.testing.assert_allclose(predicted, one_predicted, rtol=0, atol=1e-10)

    one_history = _on_tokens(one, one_device, sharded=False)
    history = _on_tokens(model, strategy, sharded=True)
    assert model.preprocessor is None
    assert_same_as_one_device(model, one, history, one_history)


def _sentencepiece_proto():
    """A SentencePiece model of the test's words (keras-hub's DeBERTa, T5, Gemma and ALBERT
    tokenizers are SentencePiece ones), trained here: no download."""
    import io

    sentencepiece = pytest.importorskip("sentencepiece")
    proto = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(_sentences(200, 0)[0].tolist()), model_writer=proto,
        vocab_size=len(WORDS) + 6, model_type="word", pad_id=0, unk_id=1, bos_id=2,
        eos_id=3, pad_piece="<pad>", unk_piece="<unk>", bos_piece="[CLS]",
        eos_piece="[SEP]", user_defined_symbols="[MASK]", minloglevel=2)
    return proto.getvalue()


@pytest.mark.slow
def test_sk_check_of_a_sentencepiece_classifier_whose_model_fn_sets_the_seed(float64):
    # keras.utils.set_random_seed clears TensorFlow's kernel cache, which holds a
    # SentencePiece tokenizer's model: the first model's tokenizer is gone once model_fn
    # runs again (NotFoundError: Resource .../SentencepieceOp/... does not exist).
    proto = _sentencepiece_proto()

    def model_fn():
        keras.utils.set_random_seed(0)  # as sk.check's docs do, before the tokenizer
        tokenizer = keras_hub.tokenizers.AlbertTokenizer(proto=proto)
        backbone = keras_hub.models.AlbertBackbone(
            vocabulary_size=tokenizer.vocabulary_size(), num_layers=1, num_heads=2,
            embedding_dim=8, hidden_dim=8, intermediate_dim=16, max_sequence_length=LENGTH,
            dropout=0.0)
        preprocessor = keras_hub.models.AlbertTextClassifierPreprocessor(
            tokenizer, sequence_length=LENGTH)
        model = keras_hub.models.AlbertTextClassifier(
            backbone, num_classes=2, preprocessor=preprocessor, dropout=0.0)
        model.compile(optimizer=keras.optimizers.AdamW(1e-2, global_clipnorm=0.1),
                      weighted_metrics=["accuracy"])
        return model

    report = sk.check(model_fn, _sentences(60, 1), strategy=sk.mirrored(cpu_devices(REPLICAS)))
    assert report.passed, str(report)
    assert {"loss", "accuracy"} <= set(report.single_device_metrics)


def test_a_byte_tokenizer_in_the_input_pipeline_trains_as_one_device(float64):
    # keras-hub's byte-level tokenizer mapped over a tf.data dataset of raw strings, as
    # keras-hub's guides map a tokenizer, then sk.shard of that dataset; one device gets
    # the same tokens in batches of the global batch.
    tokenizer = keras_hub.tokenizers.ByteTokenizer(sequence_length=LENGTH * 4)
    text, y = _sentences(TRAIN, 4)
    examples = tf.data.Dataset.from_tensor_slices((text, y)).map(
        lambda sentence, label: (tokenizer(sentence), label))

    def classifier(strategy):
        with strategy.scope():
            keras.utils.set_random_seed(0)
            model = keras.Sequential([
                keras.Input((LENGTH * 4,), dtype="int32"), keras.layers.Embedding(256, 8),
                keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(2)])
            model.compile(keras.optimizers.Adam(1e-2),
                          keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                          weighted_metrics=["accuracy"])
        return model

    strategy = sk.mirrored(cpu_devices(REPLICAS))
    one, model = classifier(tf.distribute.get_strategy()), classifier(strategy)
    one_history = one.fit(examples.batch(GLOBAL_BATCH), epochs=2, verbose=0).history
    history = model.fit(sk.shard(examples, strategy, global_batch_size=GLOBAL_BATCH),
                        epochs=2, verbose=0).history
    assert_same_as_one_device(model, one, history, one_history)
