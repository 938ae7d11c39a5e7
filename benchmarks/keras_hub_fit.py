"""A keras-hub model's whole `fit()` on sk.shard data against keras-hub's own input.

Workload: 4 simulated replicas, keras-hub's `GPT2CausalLM` of a tiny config (2 layers,
hidden size 32, sequences of 16 tokens; its `GPT2Tokenizer` from a small vocabulary and
merges, no download) fine-tuned on 320 raw texts, global batch 32, for 2 epochs
(10 steps each, traced in the call). Both variants build and compile the same model in
the scope and time the whole `fit()` call until it returns, tracing and the start of the
input included:

* `sk_shard_call`: `fit(sk.shard(texts, strategy, global_batch_size=32))`: the
  tokenizer runs in sk.shard's input pipeline (`upstream/keras_hub_pipelines.py`);
* `arrays_call`: `fit(texts, batch_size=32)`: keras-hub maps its tokenizer over a
  `tf.data` dataset of the array and Keras distributes it (no padded final batch to
  weigh here: 320 is a multiple of 32).

keras-hub's tokenizer is a large function; where it runs in the pipeline decides what
starting an iterator costs. The script runs unchanged on 4 GPUs (`sk.mirrored(replicas=4)`
takes them where there are).

    python benchmarks/keras_hub_fit.py --pairs 5
"""

from __future__ import annotations

import time

import harness

TEXTS, GLOBAL_BATCH, LENGTH, EPOCHS = 320, 32, 16, 2
WORDS = ["airplane", "at", "airport", "plane", "port", "!"]
MERGES = ["a i", "ai r", "p l", "pl a", "n e", "pla ne", "p o", "r t", "po rt", "a t",
          "Ġ a", "Ġa i", "Ġai r", "Ġ p", "Ġp l", "Ġpl a", "Ġpla ne", "Ġp o", "Ġpo rt",
          "Ġa t", "Ġ !"]


def _setup():
    import keras
    import keras_hub
    import numpy as np

    import strategykit as sk

    strategy = sk.mirrored(replicas=4)  # 4 GPUs where there are, else simulated
    tokens = ["<|endoftext|>", *sorted(set("".join(WORDS)) | {"Ġ"}),
              *(merge.replace(" ", "") for merge in MERGES)]
    with strategy.scope():
        keras.utils.set_random_seed(0)
        tokenizer = keras_hub.models.GPT2Tokenizer(
            vocabulary={token: i for i, token in enumerate(tokens)}, merges=MERGES)
        backbone = keras_hub.models.GPT2Backbone(
            vocabulary_size=len(tokens), num_layers=2, num_heads=2, hidden_dim=32,
            intermediate_dim=64, max_sequence_length=LENGTH, dropout=0.0)
        model = keras_hub.models.GPT2CausalLM(
            backbone, keras_hub.models.GPT2CausalLMPreprocessor(tokenizer,
                                                                sequence_length=LENGTH))
        model.compile(optimizer=keras.optimizers.AdamW(1e-3, global_clipnorm=1.0),
                      weighted_metrics=["accuracy"])
    rng = np.random.default_rng(0)
    texts = np.array([" ".join(rng.choice(WORDS, rng.integers(1, 8))) for _ in range(TEXTS)])
    return strategy, model, texts


def sk_shard_call() -> float:
    import strategykit as sk

    strategy, model, texts = _setup()
    start = time.perf_counter()
    model.fit(sk.shard(texts, strategy, global_batch_size=GLOBAL_BATCH), epochs=EPOCHS,
              verbose=0)
    return time.perf_counter() - start


def arrays_call() -> float:
    _, model, texts = _setup()
    start = time.perf_counter()
    model.fit(texts, batch_size=GLOBAL_BATCH, epochs=EPOCHS, verbose=0)
    return time.perf_counter() - start


if __name__ == "__main__":
    harness.main(__file__, {"sk_shard_call": sk_shard_call, "arrays_call": arrays_call},
                 [("sk_shard_call", "arrays_call")])
