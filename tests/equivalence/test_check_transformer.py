"""keras.io's Transformer text classifier passes `sk.check`, Dropout and all.

keras.io's text_classification_with_transformer, at a small size: a token and position
embedding (the position table looked up with the same indices on every replica), one
Transformer block with Dropout, Adam. `sk.check` switches the Dropout layers off on
both sides; Adam on the position table's sparse gradient trained as one device only
with `strategykit.upstream.sparse_gradients` ("differences start at layer
token_and_position_embedding" before).
"""

import keras
import numpy as np
import pytest
from keras import layers, ops

import strategykit as sk

from conftest import cpu_devices

MAXLEN, VOCABULARY, EMBED, HEADS, FF = 10, 50, 8, 2, 8


class TransformerBlock(layers.Layer):
    def __init__(self, embed_dim, num_heads, ff_dim, rate=0.1, **kwargs):
        super().__init__(**kwargs)
        self.att = layers.MultiHeadAttention(num_heads=num_heads, key_dim=embed_dim)
        self.ffn = keras.Sequential([layers.Dense(ff_dim, activation="relu"),
                                     layers.Dense(embed_dim)])
        self.layernorm1 = layers.LayerNormalization(epsilon=1e-6)
        self.layernorm2 = layers.LayerNormalization(epsilon=1e-6)
        self.dropout1 = layers.Dropout(rate)
        self.dropout2 = layers.Dropout(rate)

    def call(self, inputs):
        attn_output = self.dropout1(self.att(inputs, inputs))
        out1 = self.layernorm1(inputs + attn_output)
        return self.layernorm2(out1 + self.dropout2(self.ffn(out1)))


class TokenAndPositionEmbedding(layers.Layer):
    def __init__(self, maxlen, vocab_size, embed_dim, **kwargs):
        super().__init__(**kwargs)
        self.token_emb = layers.Embedding(input_dim=vocab_size, output_dim=embed_dim)
        self.pos_emb = layers.Embedding(input_dim=maxlen, output_dim=embed_dim)

    def call(self, x):
        maxlen = ops.shape(x)[-1]
        positions = self.pos_emb(ops.arange(start=0, stop=maxlen, step=1))
        return self.token_emb(x) + positions


def text_classifier():
    keras.utils.set_random_seed(0)
    inputs = layers.Input(shape=(MAXLEN,))
    x = TokenAndPositionEmbedding(MAXLEN, VOCABULARY, EMBED)(inputs)
    x = TransformerBlock(EMBED, HEADS, FF)(x)
    x = layers.GlobalAveragePooling1D()(x)
    x = layers.Dropout(0.1)(x)
    x = layers.Dense(20, activation="relu")(x)
    x = layers.Dropout(0.1)(x)
    model = keras.Model(inputs=inputs, outputs=layers.Dense(2, activation="softmax")(x))
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    return model


@pytest.mark.slow
def test_keras_io_transformer_text_classifier_passes():
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, VOCABULARY, size=(64, MAXLEN))
    labels = (tokens[:, 0] > VOCABULARY // 2).astype("int32")
    report = sk.check(text_classifier, (tokens, labels), strategy=sk.mirrored(cpu_devices(2)),
                      global_batch_size=16)
    assert report.passed, str(report)
    assert len(report.random_layers) == 4  # the block's two Dropouts and the head's two
