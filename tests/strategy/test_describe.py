import tensorflow as tf

import strategykit as sk

from conftest import cpu_devices


def test_default_strategy_is_one_unsimulated_device_without_all_reduce():
    described = sk.describe()
    assert described["strategy"] == "_DefaultDistributionStrategy"
    assert described["replicas"] == 1
    assert described["devices"] == ["/device:CPU:0"]
    assert described["all_reduce"] == "none"
    assert described["workers"] == 1
    assert described["simulated"] is False


def test_describe_inside_a_scope_describes_that_strategy():
    strategy = sk.mirrored(cpu_devices(2))
    with strategy.scope():
        assert sk.describe()["replicas"] == 2


def test_one_device_strategy():
    described = sk.describe(tf.distribute.OneDeviceStrategy("/cpu:1"))
    assert described["strategy"] == "OneDeviceStrategy"
    assert described["replicas"] == 1
    assert described["devices"] == ["/job:localhost/replica:0/task:0/device:CPU:1"]
    assert described["all_reduce"] == "none"
    assert described["simulated"] is False


def test_mirrored_over_four_logical_cpus_is_simulated_with_a_collective_ring():
    described = sk.describe(sk.mirrored(cpu_devices(4)))
    assert described == {
        "strategy": "MirroredStrategy",
        "replicas": 4,
        "devices": [f"/job:localhost/replica:0/task:0/device:CPU:{i}" for i in range(4)],
        "all_reduce": "collective ring",
        "workers": 1,
        "simulated": True,
        "xla": "off",  # no GPU: jit_compile="auto" is off, as on one device
    }


def test_all_reduce_names_follow_cross_device_ops():
    # Fails if TensorFlow renames the private attributes describe() reads.
    for choice, cls in [
        ("reduce_to_one_device", tf.distribute.ReductionToOneDevice),
        ("hierarchical_copy", tf.distribute.HierarchicalCopyAllReduce),
    ]:
        strategy = sk.mirrored(cpu_devices(2), cross_device_ops=choice)
        assert type(strategy.extended._cross_device_ops) is cls
        assert sk.describe(strategy)["all_reduce"] == choice


def test_mirrored_over_one_device_has_no_all_reduce():
    described = sk.describe(sk.mirrored(["/cpu:0"]))
    assert described["replicas"] == 1
    assert described["all_reduce"] == "none"
    assert described["simulated"] is False
