import json

import keras
import numpy as np
import pytest
import tensorflow as tf

import strategykit as sk
from strategykit.upstream import strategy_internals

from conftest import cpu_devices
from workers import run_workers


def replica_ids_summed(strategy) -> float:
    """All-reduces (replica id + 1) over the strategy's replicas."""

    def step():
        context = tf.distribute.get_replica_context()
        value = tf.cast(context.replica_id_in_sync_group, tf.float32) + 1.0
        return context.all_reduce("sum", value)

    return float(strategy.experimental_local_results(strategy.run(tf.function(step)))[0])


def test_mirrored_over_named_devices_has_one_replica_each():
    strategy = sk.mirrored(cpu_devices(2))
    assert isinstance(strategy, tf.distribute.MirroredStrategy)
    assert strategy.num_replicas_in_sync == 2
    assert replica_ids_summed(strategy) == 1 + 2


def test_mirrored_without_arguments_uses_the_cpu_on_a_machine_without_gpus():
    strategy = sk.mirrored()
    assert strategy.num_replicas_in_sync == 1
    assert "CPU:0" in strategy.extended.worker_devices[0]


def test_mirrored_replicas_uses_the_existing_logical_devices():
    assert sk.mirrored(replicas=3).num_replicas_in_sync == 3


def test_strategies_over_different_device_sets_coexist_in_one_process():
    # Plain MirroredStrategy objects share collective group keys and the second one
    # fails; each sk.mirrored strategy has its own keys, in any order.
    for replicas in (2, 4, 2, 3, 4):
        assert replica_ids_summed(sk.mirrored(cpu_devices(replicas))) == sum(
            range(1, replicas + 1)
        )


def test_fit_works_on_strategies_of_different_sizes_in_one_process():
    x = np.arange(32, dtype="float32").reshape(16, 2)
    y = x.sum(axis=1, keepdims=True)
    for replicas in (4, 2):
        with sk.mirrored(cpu_devices(replicas)).scope():
            model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
            model.compile("sgd", "mse")
        history = model.fit(x, y, batch_size=8, epochs=1, verbose=0)
        assert np.isfinite(history.history["loss"][0])


def test_each_strategy_gets_its_own_collective_key_range():
    # Fails if TensorFlow stops reading `_collective_key_base` from the strategy object
    # (strategykit.upstream.strategy_internals).
    first, second = sk.mirrored(cpu_devices(2)), sk.mirrored(cpu_devices(2))
    first_base = first.extended._collective_key_base
    second_base = second.extended._collective_key_base
    assert first_base != second_base
    assert first_base % strategy_internals.KEYS_PER_STRATEGY == 0


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ("reduce_to_one_device", "reduce_to_one_device"),
        ("hierarchical_copy", "hierarchical_copy"),
        ("auto", "collective ring"),
    ],
)
def test_cross_device_ops_by_name(choice, expected):
    strategy = sk.mirrored(cpu_devices(2), cross_device_ops=choice)
    assert sk.describe(strategy)["all_reduce"] == expected
    assert replica_ids_summed(strategy) == 3


def test_cross_device_ops_instance_is_used_as_given():
    strategy = sk.mirrored(cpu_devices(2), cross_device_ops=tf.distribute.ReductionToOneDevice())
    assert sk.describe(strategy)["all_reduce"] == "reduce_to_one_device"


@pytest.mark.parametrize("replicas", [0, -1, 2.0, "2", True])
def test_replicas_must_be_a_positive_integer(replicas):
    with pytest.raises(ValueError, match=r"replicas must be a positive integer\. Received: "):
        sk.mirrored(replicas=replicas)


def test_devices_and_replicas_together_are_rejected():
    with pytest.raises(ValueError, match=r"either devices or replicas, not both"):
        sk.mirrored(["/cpu:0"], replicas=1)


@pytest.mark.parametrize("devices", [[], "/cpu:0"])
def test_devices_must_be_a_non_empty_list(devices):
    with pytest.raises(ValueError, match=r"devices must be a non-empty list.*Received"):
        sk.mirrored(devices)


def test_unknown_cross_device_ops_lists_the_valid_values():
    with pytest.raises(
        ValueError,
        match=r"Unknown cross_device_ops\. Received: cross_device_ops='ring'\. Use one of "
        r"'auto', 'nccl', 'hierarchical_copy', 'reduce_to_one_device'",
    ):
        sk.mirrored(cpu_devices(2), cross_device_ops="ring")


def test_nccl_without_gpus_is_an_error_not_a_fallback():
    with pytest.raises(ValueError, match=r"'nccl' needs GPUs, and this machine has none"):
        sk.mirrored(cpu_devices(2), cross_device_ops="nccl")


@pytest.mark.slow
def test_replicas_in_a_fresh_process_split_the_cpu_and_fit(run_python):
    result = run_python(
        """
        import json, numpy as np, keras, strategykit as sk
        strategy = sk.mirrored(replicas=2)
        with strategy.scope():
            model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
            model.compile("sgd", "mse")
        x = np.random.default_rng(0).normal(size=(64, 3)).astype("float32")
        model.fit(x, x.sum(1), batch_size=16, epochs=2, verbose=0)
        print(json.dumps(sk.describe(strategy)))
        try:
            sk.mirrored(replicas=4)
        except RuntimeError as error:
            print("ERROR", error)
        """
    )
    described = json.loads(result.stdout.splitlines()[0])
    assert described["replicas"] == 2
    assert described["simulated"] is True
    assert described["all_reduce"] == "collective ring"
    error = result.stdout.splitlines()[1]
    assert "4 CPU replicas were requested, but TensorFlow has already started with 2" in error
    assert "restart the kernel" in error


def test_replicas_after_tensorflow_started_says_how_to_fix_it(run_python):
    result = run_python(
        """
        import tensorflow as tf, strategykit as sk
        tf.constant(1.0) + 1.0
        try:
            sk.mirrored(replicas=2)
        except RuntimeError as error:
            print(error)
        """
    )
    assert "TensorFlow has already started with 1 logical CPU device(s)" in result.stdout
    assert "before any other TensorFlow work" in result.stdout


# --- from_env ------------------------------------------------------------------------


def tf_config(workers=2, task=None) -> str:
    config = {"cluster": {"worker": [f"localhost:{20000 + i}" for i in range(workers)]}}
    if task is not None:
        config["task"] = task
    return json.dumps(config)


def test_from_env_without_tf_config_is_mirrored(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    assert isinstance(sk.from_env(), tf.distribute.MirroredStrategy)


def test_from_env_with_a_single_worker_is_mirrored(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", tf_config(1, {"type": "worker", "index": 0}))
    assert isinstance(sk.from_env(), tf.distribute.MirroredStrategy)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("{not json", r"TF_CONFIG is not valid JSON .*Received: TF_CONFIG='\{not json'"),
        ("[1, 2]", r"TF_CONFIG must be a JSON object"),
        (tf_config(2), r"field 'task' is missing or incomplete\. Received: task=None"),
        (tf_config(2, {"type": "worker"}), r"field 'task' is missing or incomplete"),
        (tf_config(2, {"type": "ps", "index": 0}), r"'task.type' .*Received: task.type='ps'"),
        (tf_config(2, {"type": "worker", "index": 2}), r"'task.index' is out of range\. "
         r"Received: task.index=2; the cluster has 2 'worker' task\(s\), so use 0 to 1"),
        (tf_config(2, {"type": "worker", "index": "0"}), r"'task.index' is out of range"),
        ('{"cluster": ["a:1"]}', r"field 'cluster' must map task types"),
    ],
)
def test_from_env_names_the_bad_field_of_tf_config(monkeypatch, raw, message):
    monkeypatch.setenv("TF_CONFIG", raw)
    with pytest.raises(ValueError, match=message):
        sk.from_env()


def test_from_env_rejects_cross_device_ops_that_do_not_span_workers(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", tf_config(2, {"type": "worker", "index": 0}))
    with pytest.raises(ValueError, match=r"Across several workers cross_device_ops must be"):
        sk.from_env(cross_device_ops="reduce_to_one_device")


def test_from_env_with_two_workers_all_reduces_across_processes(tmp_path):
    # Two real worker processes on this machine. Each contributes its own value, so the
    # result is only right if the all-reduce really spans both processes. (Keras 3
    # `fit()` itself does not run under MultiWorkerMirroredStrategy yet: keras#20585.)
    finished = run_workers("""
        import json, os, tensorflow as tf, strategykit as sk
        strategy = sk.from_env()
        index = json.loads(os.environ['TF_CONFIG'])['task']['index']
        @tf.function
        def step():
            context = tf.distribute.get_replica_context()
            return context.all_reduce('sum', tf.constant(10.0 ** index))
        total = strategy.experimental_local_results(strategy.run(step))[0]
        print(json.dumps({'describe': sk.describe(strategy), 'total': float(total)}))
        # Neither exits while the other may still fetch its part of the ring (the peer
        # then fails with "Socket closed"; the workers end without teardown): worker 1
        # ends once worker 0 has its total, worker 0 (the coordination service's host)
        # once worker 1 has said so, which it may do without waiting for the answer.
        from strategykit.upstream import coordination
        if index == 0:
            coordination.set_key('total/0', 'done')
            coordination.wait_for_key('total/1')
        else:
            coordination.wait_for_key('total/0')
            try:
                coordination.set_key('total/1', 'done')
            except tf.errors.UnavailableError:
                pass  # worker 0 had the key and ended before it answered
    """, 2, tmp_path=tmp_path)
    for worker in finished:
        report = worker.last_json()
        assert report["total"] == 1.0 + 10.0
        assert report["describe"]["strategy"] == "MultiWorkerMirroredStrategy"
        assert report["describe"]["workers"] == 2
        assert report["describe"]["replicas"] == 2
