"""sk.reduce against numpy, and the custom-loop loss-scaling recipe against one device."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import strategykit as sk
from strategykit.strategy import reduction

# Replica k holds row k: different values on every replica, negative and positive.
ROWS = np.array([[1.0, -2.0, 3.0], [4.0, 5.0, -6.0], [0.5, 0.0, 9.0], [-7.0, 8.0, 2.5]])
NUMPY = {"mean": np.mean, "sum": np.sum, "min": np.min, "max": np.max, "std": np.std}


def per_replica(strategy, rows):
    return strategy.experimental_distribute_values_from_function(
        lambda context: tf.constant(rows[context.replica_id_in_sync_group], tf.float32)
    )


@pytest.mark.parametrize("op", sorted(NUMPY))
def test_reduce_matches_numpy_for_every_op(make_strategy, op):
    strategy = make_strategy(4)
    result = reduction.reduce(per_replica(strategy, ROWS), strategy, op)
    np.testing.assert_allclose(result.numpy(), NUMPY[op](ROWS, axis=0), rtol=1e-6)


def test_reduce_nests_and_runs_inside_tf_function(make_strategy):
    strategy = make_strategy(2)
    values = {"a": per_replica(strategy, ROWS[:2]), "b": per_replica(strategy, ROWS[2:])}

    @tf.function
    def reduce_in_graph(values):
        return reduction.reduce(values, strategy, "max")

    result = reduce_in_graph(values)
    np.testing.assert_allclose(result["a"].numpy(), ROWS[:2].max(axis=0))
    np.testing.assert_allclose(result["b"].numpy(), ROWS[2:].max(axis=0))


def test_reduce_of_one_replica_is_the_value():
    strategy = tf.distribute.get_strategy()
    result = reduction.reduce(tf.constant(ROWS[0]), strategy, "std")
    np.testing.assert_allclose(result.numpy(), np.zeros(3))


def test_unknown_op_is_refused(make_strategy):
    with pytest.raises(ValueError, match=r"Unknown reduction\. Received: op='median'.*'std'"):
        reduction.reduce(tf.constant(1.0), make_strategy(2), "median")


def _model():
    keras.utils.set_random_seed(1)
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(2), keras.layers.Dense(1)])


def _train_custom_loop(strategy, x, y, global_batch, scale_by_global_batch):
    """The recipe of strategykit/strategy/reduction.py's docstring, two steps."""
    with strategy.scope():
        model = _model()
        optimizer = keras.optimizers.SGD(0.1)
    loss_fn = keras.losses.MeanSquaredError(reduction="none")
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch)
    iterator = iter(strategy.experimental_distribute_dataset(dataset))

    @tf.function
    def train_step(batch):
        def step(x, y):
            with tf.GradientTape() as tape:
                per_example = loss_fn(y, model(x, training=True))
                if scale_by_global_batch:
                    loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
                else:  # the classic mistake: the per-replica mean
                    loss = tf.reduce_mean(per_example)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss, tf.reduce_mean(per_example)

        return strategy.run(step, args=batch)

    results = [train_step(next(iterator)) for _ in range(2)]
    return model, results


def test_loss_scaling_recipe_matches_one_device(make_strategy):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(16, 3)).astype("float32")
    y = (x @ np.array([[1.0], [-2.0], [0.5]]) + np.arange(16)[:, None]).astype("float32")
    strategy = make_strategy(4)

    reference, _ = _train_custom_loop(tf.distribute.get_strategy(), x, y, 8, True)
    model, results = _train_custom_loop(strategy, x, y, 8, True)
    for a, b in zip(reference.get_weights(), model.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)

    scaled, replica_means = results[0]
    first = (y[:8] - _model()(x[:8]).numpy()) ** 2  # the initial model on the first batch
    np.testing.assert_allclose(reduction.reduce(scaled, strategy, "sum"), first.mean(), rtol=1e-5)
    np.testing.assert_allclose(reduction.reduce(replica_means, strategy, "max"),
                               first.reshape(4, 2).mean(axis=1).max(), rtol=1e-5)

    wrong, _ = _train_custom_loop(strategy, x, y, 8, False)
    differences = [np.max(np.abs(a - b)) for a, b in zip(reference.get_weights(),
                                                         wrong.get_weights())]
    assert max(differences) > 1e-3  # the per-replica mean trains differently


def test_public_names():
    """The API contract: `sk.reduce` and `sk.callbacks.CrossReplicaLoss` / `LossPlot`."""
    from strategykit import callbacks

    assert sk.reduce is reduction.reduce
    assert sk.callbacks is callbacks
    assert {"CrossReplicaLoss", "LossPlot"} <= set(sk.callbacks.__all__)
