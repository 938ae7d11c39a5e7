"""Keras hides strategykit's frames from the tracebacks of errors raised through fit(),
as it hides its own: the user's frame is innermost and none of ours shows."""

import os
import traceback

import keras
import numpy as np
import pytest

import strategykit as sk


class Failing(keras.Model):
    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(1)

    def call(self, x):
        return self.dense(x)

    def train_step(self, data):
        raise ValueError("the user's own error")


def test_an_error_in_a_train_step_shows_the_users_frame_and_none_of_ours(make_strategy):
    strategy = make_strategy(2)
    with strategy.scope():
        model = Failing()
        model.compile("sgd", "mse")
    x = np.ones((8, 3), "float32")
    with pytest.raises(ValueError, match="the user's own error") as caught:
        model.fit(sk.shard((x, x[:, :1]), strategy, global_batch_size=4), verbose=0)
    frames = traceback.extract_tb(caught.value.__traceback__)
    package = os.path.dirname(sk.__file__) + os.sep
    assert [frame.filename for frame in frames if frame.filename.startswith(package)] == []
    assert (frames[-1].filename, frames[-1].name) == (__file__, "train_step")
