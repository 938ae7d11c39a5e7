"""An optimizer first built in a custom train_step trains under a strategy
(keras-team/keras#20164: Keras builds it inside the traced replica step, where its
variables cannot be created, and the step fails with "You must feed a value for
placeholder tensor")."""

import keras
import numpy as np
import tensorflow as tf

import strategykit as sk
from strategykit import upstream

from conftest import cpu_devices


class TwoOptimizers(keras.Model):
    """The keras.io GAN's shape without its randomness: `compile(d_optimizer, g_optimizer,
    loss_fn)` and a train_step applying each optimizer to its own sub-model, y = g(d(x))."""

    def __init__(self):
        super().__init__()
        self.first = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        self.second = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])

    def call(self, x):
        return self.second(self.first(x))

    def compile(self, d_optimizer, g_optimizer, loss_fn):
        super().compile()
        self.d_optimizer, self.g_optimizer, self.loss_fn = d_optimizer, g_optimizer, loss_fn

    def train_step(self, data):
        x, y, _ = keras.utils.unpack_x_y_sample_weight(data)  # 24 examples: no padding
        for optimizer, part in [(self.d_optimizer, self.first), (self.g_optimizer, self.second)]:
            with tf.GradientTape() as tape:
                loss = self.loss_fn(y, self(x))
            grads = tape.gradient(loss, part.trainable_weights)
            optimizer.apply_gradients(zip(grads, part.trainable_weights))
        return {"loss": loss}


def trained(strategy, x, y):
    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = TwoOptimizers()
        model.compile(keras.optimizers.SGD(0.1, momentum=0.9), keras.optimizers.Adam(0.01),
                      keras.losses.MeanSquaredError())
    data = sk.shard((x, y), strategy, global_batch_size=8) if strategy.num_replicas_in_sync > 1 \
        else tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
    model.fit(data, epochs=1, verbose=0)
    return model


def test_optimizers_built_in_the_step_train_like_one_device():
    # sk.mirrored: a plain MirroredStrategy numbers its collectives from 1, and would join
    # the groups of the suite's other plain strategies in the same process.
    upstream.install()
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(24, 3)).astype("float32"), rng.normal(size=(24, 1)).astype("float32")
    reference = trained(tf.distribute.get_strategy(), x, y)
    strategy = sk.mirrored(cpu_devices(4))
    model = trained(strategy, x, y)
    for optimizer in (model.d_optimizer, model.g_optimizer):
        assert int(optimizer.iterations.numpy()) == 3
        assert optimizer.variables and all(  # built in the scope: mirrored on each replica
            strategy.extended.variable_created_in_scope(v.value) for v in optimizer.variables)
    for weight, expected in zip(model.weights, reference.weights, strict=True):
        np.testing.assert_allclose(np.asarray(weight), np.asarray(expected), atol=1e-5,
                                   err_msg=weight.path)
