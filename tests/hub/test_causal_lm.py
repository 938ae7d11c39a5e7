"""keras-hub's causal LM fine-tuned on 2 replicas of sk.shard text equals one device.

A `GPT2CausalLM` of a tiny config (no download), its `GPT2Tokenizer` from a small
vocabulary and merges, fed raw strings (sk.shard data without labels): its preprocessor
makes the inputs, the next-token labels and the padding mask as weights in each
replica's own input pipeline. 21 texts (a full batch, then a final batch of 5, padded:
3 and 2 real texts on the replicas), float64, against one device on the same global
batches, run eagerly (the same computation untraced): weights and `fit()`'s numbers
(`evaluate()` of sk.shard data on keras-hub models: tests/hub/test_text_classifier.py).
Fine-tuned with LoRA too, as keras-hub's LoRA guide does (`backbone.enable_lora(rank=4)`,
AdamW without weight decay on biases and scales): Keras makes the LoRA kernels float32
in a float64 model, and their gradients' dtype beside the others' failed TensorFlow's
all-reduce (`strategykit.upstream.sparse_gradients`; without it this test fails on 2
replicas as on 4).

2 replicas, as in the other keras-hub tests: each replica traces the step once, so 4
would double the CPU of these tests, and 2 already give each replica its own texts and
pad the final batch unevenly.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import strategykit as sk

from conftest import assert_same_as_one_device, cpu_devices, reference_runs_eagerly

keras_hub = pytest.importorskip("keras_hub")

TRAIN, GLOBAL_BATCH, LENGTH, REPLICAS = 21, 16, 8, 2
WORDS = ["airplane", "at", "airport", "plane", "port", "!"]
MERGES = ["a i", "ai r", "p l", "pl a", "n e", "pla ne", "p o", "r t", "po rt", "a t",
          "Ġ a", "Ġa i", "Ġai r", "Ġ p", "Ġp l", "Ġpl a", "Ġpla ne", "Ġp o", "Ġpo rt",
          "Ġa t", "Ġ !"]
TOKENS = ["<|endoftext|>", *sorted(set("".join(WORDS)) | {"Ġ"}),
          *(merge.replace(" ", "") for merge in MERGES)]


def _causal_lm(strategy, lora: bool = False):
    with strategy.scope():
        keras.utils.set_random_seed(0)
        tokenizer = keras_hub.models.GPT2Tokenizer(
            vocabulary={token: i for i, token in enumerate(TOKENS)}, merges=MERGES)
        backbone = keras_hub.models.GPT2Backbone(
            vocabulary_size=len(TOKENS), num_layers=1, num_heads=2, hidden_dim=8,
            intermediate_dim=16, max_sequence_length=LENGTH, dropout=0.0)
        model = keras_hub.models.GPT2CausalLM(
            backbone, keras_hub.models.GPT2CausalLMPreprocessor(tokenizer,
                                                                sequence_length=LENGTH))
        if lora:  # keras-hub's LoRA guide
            model.backbone.enable_lora(rank=4)
            optimizer = keras.optimizers.AdamW(learning_rate=1e-2, weight_decay=0.01)
            optimizer.exclude_from_weight_decay(var_names=["bias", "scale"])
        else:  # keras-hub's recipes: AdamW, the global gradient clipped (0.1: acts)
            optimizer = keras.optimizers.AdamW(1e-2, global_clipnorm=0.1)
        model.compile(optimizer=optimizer,
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      weighted_metrics=["accuracy"], run_eagerly=reference_runs_eagerly())
    return model


def _texts(examples, seed):
    rng = np.random.default_rng(seed)
    return np.array([" ".join(rng.choice(WORDS, rng.integers(1, 6))) for _ in range(examples)])


def _fine_tuned(strategy, sharded: bool, lora: bool = False):
    model = _causal_lm(strategy, lora)
    train = _texts(TRAIN, 1)
    if sharded:
        train = {"x": sk.shard(train, strategy, global_batch_size=GLOBAL_BATCH)}
    else:
        train = {"x": train, "batch_size": GLOBAL_BATCH, "shuffle": False}
    return model, model.fit(**train, epochs=1, verbose=0).history


@pytest.mark.slow
def test_fine_tuning_a_causal_lm_on_two_replicas_equals_one_device(float64):
    one, one_history = _fine_tuned(tf.distribute.get_strategy(), sharded=False)
    model, history = _fine_tuned(sk.mirrored(cpu_devices(REPLICAS)), sharded=True)
    assert_same_as_one_device(model, one, history, one_history)


@pytest.mark.slow
def test_lora_fine_tuning_in_float64_on_two_replicas_equals_one_device(float64):
    one, one_history = _fine_tuned(tf.distribute.get_strategy(), sharded=False, lora=True)
    model, history = _fine_tuned(sk.mirrored(cpu_devices(REPLICAS)), sharded=True, lora=True)
    trained = {weight.path: weight.dtype for weight in model.trainable_weights}
    assert trained and all("lora_kernel" in path or path.endswith("bias")
                           or "layer_norm" in path for path in trained)
    # Keras 3.15 makes the LoRA kernels float32 (3.8 to 3.13: of the layer's dtype): float32
    # rounding then, each replica's LoRA gradient rounded before the sum, one device's
    # once (3.7e-9 here)
    mixed = {"float32", "float64"} <= set(trained.values())
    tolerance = {"atol": 1e-7, "rtol": 1e-9} if mixed else {}
    assert_same_as_one_device(model, one, history, one_history, **tolerance)


def test_generate_given_sk_shard_data_refuses_naming_the_prompts_as_the_fix():
    strategy = sk.mirrored(cpu_devices(REPLICAS))
    model = _causal_lm(strategy)
    prompts = _texts(6, 2).tolist()  # keras-hub's tokenizers take no numpy array
    with pytest.raises(ValueError, match=(
            r"generate\(\) of a keras-hub model takes the prompts themselves, not sk.shard "
            r"data.*Received: inputs of type \w+ \(sk.shard data\). Pass the prompts: "
            r"model.generate\(prompts\)")):
        model.generate(sk.shard(prompts, strategy, global_batch_size=4), max_length=LENGTH)
    # the fix: the prompts themselves, generated as one device generates them
    one = _causal_lm(tf.distribute.get_strategy())
    assert model.generate(prompts, max_length=LENGTH) == one.generate(prompts, max_length=LENGTH)
