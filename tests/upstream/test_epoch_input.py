"""Keras reads `sk.shard` data through one iterator per dataset (`upstream.epoch_input`),
runs `steps_per_execution` steps under several replicas (`upstream.steps_per_execution`)
and deletes the iterators it is done with off the user's thread (`iterator_reaper`)."""

import threading
import time
import weakref

import keras
import numpy as np
import pytest
from tensorflow.python.distribute import input_lib

import strategykit as sk
from strategykit.background import iterator_reaper
from strategykit.upstream import epoch_input

from conftest import bn_regressor, restorer


@pytest.fixture
def iterators_made(monkeypatch):
    """Every distributed dataset iterator started from now on (Keras's and ours): the
    datasets they were started from, one per iterator; the iterators themselves in its
    `iterators`.

    The iterators are held until the test ends, then handed to the reaper: a test of
    Keras's own loop, which drops them on its thread, would wait there for each deletion.
    """
    made = _Started()
    for cls in (input_lib.DistributedDataset, input_lib.DistributedDatasetsFromFunction):
        def counted(self, original=cls.__iter__):
            made.append(self)
            made.iterators.append(original(self))
            return made.iterators[-1]

        monkeypatch.setattr(cls, "__iter__", counted)
    yield made
    while made.iterators:
        iterator_reaper.release(made.iterators.pop())


class _Started(list):
    """The datasets iterated (`iterators_made`), and in `iterators` the iterators."""

    def __init__(self):
        super().__init__()
        self.iterators = []


def _regression_data(size, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(size, 3)).astype("float32")
    return x, (x @ np.array([1.0, -2.0, 0.5]) + rng.normal(size=size)).astype("float32")


def test_a_fit_with_validation_starts_one_iterator_per_dataset(make_strategy, iterators_made):
    strategy = make_strategy(2)  # iterators are started per dataset, whatever the replicas
    x, y = _regression_data(100)
    train = sk.shard((x, y), strategy, global_batch_size=16, shuffle=True, seed=1)
    val = sk.shard((x[:40], y[:40]), strategy, global_batch_size=16)
    with strategy.scope():
        model = bn_regressor()
    model.fit(train, epochs=3, validation_data=val, verbose=0)
    assert len(iterators_made) == 2
    model.evaluate(val, verbose=0)
    model.fit(train, epochs=1, validation_data=val, verbose=0)  # epoch 0's order again
    assert len(iterators_made) == 3
    model.fit(train, epochs=3, initial_epoch=2, validation_data=val, verbose=0)  # after 0
    assert len(iterators_made) == 4


def test_without_the_fix_keras_starts_two_iterators_per_epoch(make_strategy, iterators_made):
    # When Keras keeps its iterator across epochs this fails: then the fix can go.
    strategy = make_strategy(2)  # iterators are started per dataset, whatever the replicas
    x, y = _regression_data(64)
    train = sk.shard((x, y), strategy, global_batch_size=16)
    val = sk.shard((x[:40], y[:40]), strategy, global_batch_size=16)
    with strategy.scope():
        model = bn_regressor()
    fix, = epoch_input.FIXES
    fix.uninstall()
    try:
        model.fit(train, epochs=3, validation_data=val, verbose=0)
    finally:
        fix.install()
    assert len(iterators_made) == 3 * 2 * 2  # at each epoch's start and end, both datasets


def test_plain_distributed_data_gets_one_iterator_per_epoch(make_strategy, iterators_made,
                                                           monkeypatch):
    import tensorflow as tf

    # The releases to the reaper of the iterators this fit() starts, counted. Not every
    # release: an earlier test's Keras epoch iterator, collected during this fit(), hands
    # its last iterator over then too.
    released = []
    release = iterator_reaper.release
    monkeypatch.setattr(iterator_reaper, "release", lambda iterator: (
        released.append(1) if any(iterator is own for own in iterators_made.iterators)
        else None, release(iterator)))
    strategy = make_strategy(2)
    x, y = _regression_data(64)
    with strategy.scope():
        model = bn_regressor()
    batches = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
    model.fit(batches, epochs=3, verbose=0)
    assert len(iterators_made) == 3  # one per epoch (the model built from the specs)
    assert len(released) == 3  # each to the reaper, when the next starts or fit() ends
    # Not waited for here: in a process shared with other tests the reaper's one thread
    # may still be busy deleting theirs (its deletions: the reaper tests below).


def test_a_built_model_starts_no_iterator_to_build_itself(make_strategy, iterators_made):
    # Keras starts an iterator of the data in every fit() and evaluate(), validation
    # included, to build the model from a batch; once built, it ignores that batch.
    strategy = make_strategy(2)
    x, y = _regression_data(64)
    with strategy.scope():
        model = bn_regressor()
    model.fit(x, y, batch_size=16, epochs=3, validation_data=(x, y), verbose=0)
    assert len(iterators_made) == 3 + 3  # each epoch, each dataset; built from the specs
    model.evaluate(x, y, batch_size=16, verbose=0)
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    assert len(iterators_made) == 6 + 1 + 1


def test_data_whose_specs_leave_a_shape_unknown_builds_the_model_from_a_batch(
        make_strategy, iterators_made):
    import tensorflow as tf

    strategy = make_strategy(2)
    x, y = _regression_data(64)
    unknown = tf.data.Dataset.from_generator(  # (None, None): the features' count unknown
        lambda: iter([(x[i:i + 16], y[i:i + 16]) for i in range(0, 64, 16)]),
        output_signature=(tf.TensorSpec((None, None)), tf.TensorSpec((None,))))
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = keras.Sequential([keras.layers.Dense(1)])  # built from the data's shapes
        model.compile("sgd", "mse")
    model.fit(unknown, epochs=1, verbose=0)
    assert model.layers[0].kernel.shape == (3, 1)
    assert len(iterators_made) == 1 + 1  # a batch to build it from, then the epoch


def _sync_bn_classifier(seed=0, steps_per_execution=1):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([
        keras.Input((3,)), keras.layers.Dense(8), sk.SyncBatchNormalization(),
        keras.layers.ReLU(), keras.layers.Dense(3)])
    model.compile(keras.optimizers.SGD(0.2),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"], weighted_metrics=["accuracy"],
                  steps_per_execution=steps_per_execution)
    return model


def test_steps_per_execution_on_four_replicas_equals_one_device(make_strategy):
    # 7 steps of 16 (the 7th of 4 real examples when padded): executions of 4 and 3 steps;
    # 6 when the remainder is dropped: executions of 4 and 2. Both remainders train the
    # same two models (traced once: the elements have the same shapes either way), each
    # reset to its initial weights and optimizer state before the second.
    x, _ = _regression_data(100, seed=2)
    y = (x[:, 0] > 0).astype("int32") + (x[:, 1] > 0.5)
    single = _sync_bn_classifier()
    single.optimizer.build(single.trainable_variables)
    strategy = make_strategy(4)
    with strategy.scope():
        model = _sync_bn_classifier(steps_per_execution=4)
        model.optimizer.build(model.trainable_variables)
    restores = [restorer(single), restorer(model)]
    for remainder in ("pad", "drop"):
        for restore in restores:
            restore()
        drop = remainder == "drop"
        examples = 96 if drop else 100  # dropped: one device on the same full batches
        history = single.fit(x[:examples], y[:examples], batch_size=16, epochs=2,
                             shuffle=False, verbose=0).history
        data = sk.shard((x, y), strategy, global_batch_size=16, drop_remainder=drop)
        logs = model.fit(data, epochs=2, validation_data=data, verbose=0).history
        for a, b in zip(single.get_weights(), model.get_weights()):
            np.testing.assert_allclose(a, b, atol=2e-5, err_msg=remainder)
        for name in ("loss", "accuracy", "weighted_accuracy"):
            np.testing.assert_allclose(history[name], logs[name], atol=2e-5,
                                       err_msg=f"{remainder}: {name}")
        reference = single.evaluate(x[:examples], y[:examples], batch_size=16, verbose=0,
                                    return_dict=True)
        evaluated = model.evaluate(data, verbose=0, return_dict=True)
        for name, value in reference.items():
            np.testing.assert_allclose(value, evaluated[name], atol=2e-5,
                                       err_msg=f"{remainder}: {name}")
            np.testing.assert_allclose(value, logs[f"val_{name}"][-1], atol=2e-5,
                                       err_msg=f"{remainder}: val_{name}")


def test_steps_per_execution_counts_every_step_in_callbacks(make_strategy):
    strategy = make_strategy(2)
    x, y = _regression_data(80)
    with strategy.scope():
        model = bn_regressor()
        model.compile(keras.optimizers.SGD(0.1), "mse", steps_per_execution=2)
    ends = []
    callback = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: ends.append(batch))
    model.fit(sk.shard((x, y), strategy, global_batch_size=16), epochs=1, verbose=0,
              callbacks=[callback])
    # 5 steps: executions of 2, 2 and 1, each reported by its last step (by its first on
    # Keras 3.8, whose epochs yield no last step and whose callbacks get the first).
    assert ends == ([1, 3, 4] if epoch_input.yields_last_step() else [0, 2, 4])
    assert model.optimizer.iterations.numpy() == 5


def test_released_iterators_are_deleted_on_the_reapers_thread():
    deleted_on = []

    class Noted:
        def __del__(self):
            deleted_on.append(threading.current_thread().name)

    # A reaper of its own: the process's one may be busy with other tests' iterators.
    reaper = iterator_reaper.IteratorReaper(name="test-reaper")
    held = Noted()
    reaper.release(held)
    reaper.release(held)  # twice (Keras's loop and a caller can both): held once
    time.sleep(0.5)
    assert reaper.pending() == 1 and not deleted_on  # the caller still holds it
    del held  # the caller's last reference goes; the reaper's is then the only one
    assert reaper.wait_until_idle(timeout=10)
    assert deleted_on == ["test-reaper"]
    reaper.stop()


def test_a_release_inside_the_reapers_own_lock_does_not_deadlock():
    # A garbage collection can start inside any locked section of the reaper (an
    # allocation) and run a finalizer that releases an iterator on that same thread.
    reaper = iterator_reaper.IteratorReaper(name="test-reaper")

    def release_while_locked():
        with reaper._lock:
            reaper.release(object())

    thread = threading.Thread(target=release_while_locked, daemon=True)
    thread.start()
    thread.join(timeout=10)
    assert not thread.is_alive(), "release() deadlocked on the reaper's lock"
    assert reaper.wait_until_idle(timeout=10)
    reaper.stop()


def test_at_exit_the_deletion_in_progress_ends_and_the_others_are_left_to_the_os(
        run_python, tmp_path):
    # A daemon thread coming back from TensorFlow after Python began to finalize is ended
    # inside TensorFlow's C++ code, which aborts the process (exit code 134): the reaper
    # finishes its deletion at exit first. Without that, the first deletion is cut short.
    # The ones not begun are left to the OS, not deleted while Python finalizes: each can
    # wait up to a minute on tf.data's threads. Exactly one of the three is deleted.
    run_python(f"""
        import time
        from strategykit.background import iterator_reaper

        class SlowToDelete:
            def __init__(self, name):
                self.name = name

            def __del__(self):
                time.sleep(1.0)
                open({str(tmp_path)!r} + "/deleted-" + self.name, "w").close()

        for name in "abc":
            iterator_reaper.release(SlowToDelete(name))
        time.sleep(0.5)  # the reaper has started deleting the first
    """)
    assert len(list(tmp_path.glob("deleted-*"))) == 1


@pytest.mark.parametrize("steps_per_epoch", [3, None])  # Keras's own loop, both ways
def test_keras_own_iterators_are_deleted_on_the_reapers_thread(make_strategy, monkeypatch,
                                                               steps_per_epoch):
    import gc

    import tensorflow as tf

    # Earlier tests' garbage first: what its finalizers release goes to the process's
    # reaper, not to this test's (an iterator both held would be deleted by neither).
    gc.collect()
    reaper = iterator_reaper.IteratorReaper(name="test-reaper")  # not busy with others'
    monkeypatch.setattr(iterator_reaper, "release", reaper.release)
    made, deleted_on = [], []
    for cls in (input_lib.DistributedDataset, input_lib.DistributedDatasetsFromFunction):
        def noted(self, original=cls.__iter__):
            iterator = original(self)
            made.append(1)
            weakref.finalize(iterator, lambda: deleted_on.append(
                threading.current_thread().name))
            return iterator

        monkeypatch.setattr(cls, "__iter__", noted)
    strategy = make_strategy(2)
    x, y = _regression_data(64)
    with strategy.scope():
        model = bn_regressor()
    # Repeated with steps_per_epoch: one iterator for the whole fit(); unknown length
    # without it: Keras's loop reads until the data ends, a new iterator per epoch.
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
    data = data.repeat() if steps_per_epoch else data.filter(lambda *_: True)
    model.fit(data, epochs=2, steps_per_epoch=steps_per_epoch, verbose=0)
    made_by_fit = len(made)
    model.evaluate(data, steps=steps_per_epoch, verbose=0)
    gc.collect()  # on this thread: deletes Keras's epoch iterators, not their iterators
    assert reaper.wait_until_idle(timeout=120)
    assert made_by_fit == (1 if steps_per_epoch else 2)
    assert len(deleted_on) == len(made) and set(deleted_on) == {"test-reaper"}
    reaper.stop()
