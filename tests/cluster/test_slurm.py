"""sk.from_env() under SLURM: detection, the cluster resolver, the chief, two real workers.

A fake `scontrol` on PATH stands in for Slurm's: it prints the node names it was given
at creation and records its arguments. Building a resolver does not start TensorFlow's
runtime, so those tests run in-process; strategies across workers run in subprocesses.
"""

import json
import os
import socket
import stat

import pytest
import tensorflow as tf

import strategykit as sk
from strategykit.cluster.environments import slurm
from strategykit.cluster.environments.port import PORT_VARIABLE
from strategykit.cluster.roles import is_chief, worker_index

from workers import run_processes

SlurmClusterResolver = tf.distribute.cluster_resolver.SlurmClusterResolver
_PATH = os.environ.get("PATH", "")  # before the tests below empty it


@pytest.fixture(autouse=True)
def outside_slurm(monkeypatch, tmp_path):
    """Every test starts outside SLURM, without TF_CONFIG, GPUs, scontrol or nvidia-smi."""
    for name in list(os.environ):
        if name.startswith(("SLURM_", "SLURMD_")):
            monkeypatch.delenv(name)
    for name in ("TF_CONFIG", "CUDA_VISIBLE_DEVICES", PORT_VARIABLE):
        monkeypatch.delenv(name, raising=False)
    empty = tmp_path / "empty_bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))


def fake_scontrol(directory, hosts):
    """Writes an executable `scontrol` printing `hosts`, one a line; returns its directory."""
    directory.mkdir(exist_ok=True)
    script = directory / "scontrol"
    lines = "".join(f"echo {host}\n" for host in hosts)
    script.write_text(f'#!/bin/sh\necho "$@" > "{directory}/arguments"\n{lines}')
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return directory


@pytest.fixture
def scontrol(monkeypatch, tmp_path):
    """`scontrol(hosts)` puts a fake scontrol printing `hosts` on PATH."""

    def install(hosts):
        directory = fake_scontrol(tmp_path / "slurm_bin", hosts)
        monkeypatch.setenv("PATH", f"{directory}{os.pathsep}{os.environ['PATH']}")
        return directory

    return install


def slurm_step(monkeypatch, *, procid, tasks, nodelist, tasks_per_node, node=None):
    """Sets the variables srun sets in task `procid` of a step."""
    values = {
        "SLURM_PROCID": procid, "SLURM_STEP_NUM_TASKS": tasks, "SLURM_NTASKS": tasks,
        "SLURM_STEP_NODELIST": nodelist, "SLURM_STEP_TASKS_PER_NODE": tasks_per_node,
        "SLURM_JOB_ID": 1234,
    }
    if node is not None:
        values["SLURMD_NODENAME"] = node
    for name, value in values.items():
        monkeypatch.setenv(name, str(value))


# --- detection -----------------------------------------------------------------------


def test_outside_slurm_there_is_one_task():
    assert slurm.slurm_tasks() == 1
    assert slurm.slurm_task_index() == 0


def test_a_task_of_a_step_sees_the_step_size(monkeypatch):
    slurm_step(monkeypatch, procid=2, tasks=4, nodelist="n[1-2]", tasks_per_node="2(x2)")
    assert slurm.slurm_tasks() == 4
    assert slurm.slurm_task_index() == 2


def test_a_batch_script_is_one_process_whatever_the_allocation(monkeypatch):
    # `sbatch -n 4 job.sh` runs job.sh once: SLURM_NTASKS=4 but no step variables.
    monkeypatch.setenv("SLURM_NTASKS", "4")
    monkeypatch.setenv("SLURM_PROCID", "0")
    assert slurm.slurm_tasks() == 1


@pytest.mark.parametrize(
    ("procid", "tasks", "message"),
    [
        ("0", "four", r"SLURM_STEP_NUM_TASKS must be an integer of at least 1\. "
                      r"Received: SLURM_STEP_NUM_TASKS='four'"),
        ("-1", "2", r"SLURM_PROCID must be an integer of at least 0\. Received: "),
        ("2", "2", r"SLURM_PROCID is not a task of this step\. Received: SLURM_PROCID='2', "
                   r"SLURM_STEP_NUM_TASKS='2'"),
    ],
)
def test_malformed_slurm_variables_are_named(monkeypatch, procid, tasks, message):
    monkeypatch.setenv("SLURM_PROCID", procid)
    monkeypatch.setenv("SLURM_STEP_NUM_TASKS", tasks)
    with pytest.raises(ValueError, match=message):
        slurm.slurm_tasks()


# --- the resolver --------------------------------------------------------------------


def test_resolver_of_four_tasks_on_two_nodes(monkeypatch, scontrol):
    directory = scontrol(["node1", "node2"])
    slurm_step(monkeypatch, procid=3, tasks=4, nodelist="node[1-2]", tasks_per_node="2(x2)",
               node="node2")
    resolver = slurm.slurm_resolver()
    assert isinstance(resolver, SlurmClusterResolver)
    assert resolver.cluster_spec().as_dict() == {
        "worker": ["node1:8888", "node1:8889", "node2:8888", "node2:8889"]
    }
    assert (resolver.task_type, resolver.task_id) == ("worker", 3)
    assert resolver.num_accelerators() == {"GPU": 0}  # no GPUs: each task a CPU worker
    assert "CUDA_VISIBLE_DEVICES" not in os.environ
    assert (directory / "arguments").read_text().split() == ["show", "hostnames", "node[1-2]"]


@pytest.mark.parametrize("procid", [0, 1])
def test_every_task_gets_its_own_address_on_a_shared_node(monkeypatch, scontrol, procid):
    scontrol(["localhost"])
    slurm_step(monkeypatch, procid=procid, tasks=2, nodelist="localhost", tasks_per_node="2")
    monkeypatch.setenv(PORT_VARIABLE, "23456")
    resolver = slurm.slurm_resolver()
    assert resolver.cluster_spec().as_dict() == {
        "worker": ["localhost:23456", "localhost:23457"]
    }
    assert resolver.task_id == procid


def test_port_argument_wins_over_the_environment(monkeypatch, scontrol):
    scontrol(["a", "b"])
    slurm_step(monkeypatch, procid=0, tasks=2, nodelist="a,b", tasks_per_node="1(x2)")
    monkeypatch.setenv(PORT_VARIABLE, "23456")
    assert slurm.slurm_resolver(port=30000).cluster_spec().as_dict() == {
        "worker": ["a:30000", "b:30000"]
    }


@pytest.mark.parametrize("raw", ["http", "0", "65536", "65535", "-5"])
def test_a_bad_port_is_named(monkeypatch, scontrol, raw):
    scontrol(["localhost"])
    slurm_step(monkeypatch, procid=0, tasks=2, nodelist="localhost", tasks_per_node="2")
    monkeypatch.setenv(PORT_VARIABLE, raw)
    with pytest.raises(
        ValueError,
        match=rf"must be an integer from 1 to 65534 \(the 2 task\(s\) on a node use it .*\)\. "
              rf"Received: STRATEGYKIT_PORT='{raw}'\. Use e\.g\. STRATEGYKIT_PORT=",
    ):
        slurm.slurm_resolver()


def test_building_the_resolver_does_not_start_tensorflow(run_python, tmp_path):
    # In a fresh process (the suite's started TensorFlow long ago): devices can still be
    # configured after the resolver resolved the cluster, so the runtime has not started.
    directory = fake_scontrol(tmp_path / "bin", ["localhost"])
    result = run_python(
        """
        import tensorflow as tf
        from strategykit.cluster.environments import slurm
        resolver = slurm.slurm_resolver()
        resolver.cluster_spec()
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
        print(len(tf.config.list_logical_devices("CPU")))
        """,
        env={"PATH": f"{directory}{os.pathsep}{_PATH}", "SLURM_PROCID": "0",
             "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_NODELIST": "localhost",
             "SLURM_STEP_TASKS_PER_NODE": "2"},
    )
    assert result.stdout.split() == ["2"]


def test_without_scontrol_tensorflow_expands_a_plain_node_list(monkeypatch):
    slurm_step(monkeypatch, procid=1, tasks=2, nodelist="n[08-09]", tasks_per_node="1(x2)")
    resolver = slurm.slurm_resolver()
    assert resolver.cluster_spec().as_dict() == {"worker": ["n08:8888", "n09:8888"]}
    assert resolver.task_id == 1


def test_a_node_list_that_needs_scontrol_without_scontrol_says_so(monkeypatch):
    slurm_step(monkeypatch, procid=0, tasks=2, nodelist="gpu[1-2]-ib", tasks_per_node="1(x2)")
    with pytest.raises(
        RuntimeError,
        match=r"cannot be expanded without Slurm's `scontrol`, which is not on PATH .*"
              r"Received: SLURM_STEP_NODELIST='gpu\[1-2\]-ib'\. Put Slurm's bin directory on "
              r"PATH",
    ):
        sk.from_env()


def test_the_same_node_list_with_scontrol_works(monkeypatch, scontrol):
    scontrol(["gpu1-ib", "gpu2-ib"])
    slurm_step(monkeypatch, procid=0, tasks=2, nodelist="gpu[1-2]-ib", tasks_per_node="1(x2)")
    assert slurm.slurm_resolver().cluster_spec().as_dict() == {
        "worker": ["gpu1-ib:8888", "gpu2-ib:8888"]
    }


def test_a_failing_scontrol_is_an_error_naming_the_node_list(monkeypatch, tmp_path):
    directory = tmp_path / "broken"
    directory.mkdir()
    script = directory / "scontrol"
    script.write_text("#!/bin/sh\necho 'slurm_load_partitions: Unable to contact' >&2\nexit 1\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", str(directory))
    slurm_step(monkeypatch, procid=0, tasks=2, nodelist="n[1-2]", tasks_per_node="1(x2)")
    with pytest.raises(RuntimeError, match=r"`scontrol show hostnames` could not expand .*"
                       r"exit code 1: 'slurm_load_partitions.*Received: "
                       r"SLURM_STEP_NODELIST='n\[1-2\]'"):
        slurm.slurm_resolver()


@pytest.mark.parametrize(
    ("tasks_per_node", "message"),
    [
        ("3,1", r"SLURM_STEP_TASKS_PER_NODE does not describe the step's 2 task\(s\)\. "
                r"Received: SLURM_STEP_TASKS_PER_NODE='3,1', SLURM_STEP_NUM_TASKS=2"),
        ("two", r"SLURM_STEP_TASKS_PER_NODE does not describe"),
        ("2", r"node list and tasks per node do not match: 2 node\(s\), 1 count\(s\)"),
    ],
)
def test_inconsistent_step_variables_are_named(monkeypatch, scontrol, tasks_per_node, message):
    scontrol(["n1", "n2"])
    slurm_step(monkeypatch, procid=0, tasks=2, nodelist="n[1-2]", tasks_per_node=tasks_per_node)
    with pytest.raises(ValueError, match=message):
        slurm.slurm_resolver()


def test_outside_a_step_the_resolver_says_to_use_srun():
    with pytest.raises(ValueError, match=r"SLURM_STEP_NUM_TASKS is not set: this process is "
                       r"not a task of a SLURM job step\. Received: SLURM_STEP_NUM_TASKS=None\. "
                       r"Start the workers with srun"):
        slurm.slurm_resolver()


def test_a_task_on_another_node_than_the_resolver_expects_is_an_error(monkeypatch, scontrol):
    # SlurmClusterResolver orders nodes as text: n10 before n9. Task 0 runs on n9, the
    # first node of SLURM's list, but the resolver gives it n10's address.
    scontrol(["n9", "n10"])
    slurm_step(monkeypatch, procid=0, tasks=2, nodelist="n[9-10]", tasks_per_node="1(x2)",
               node="n9")
    with pytest.raises(RuntimeError, match=r"places SLURM task 0 on node 'n10', but SLURM "
                       r"started it on 'n9'.*Received: SLURMD_NODENAME='n9'"):
        slurm.slurm_resolver()


# --- GPUs: TensorFlow's own handling where there are GPUs -----------------------------


def test_gpus_are_shared_out_by_tensorflows_resolver(monkeypatch, scontrol):
    scontrol(["g1"])
    slurm_step(monkeypatch, procid=1, tasks=2, nodelist="g1", tasks_per_node="2")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    resolver = slurm.slurm_resolver()
    assert type(resolver) is SlurmClusterResolver
    assert resolver.num_accelerators() == {"GPU": 2}
    resolver.cluster_spec()
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "2,3"  # task 1: the node's second pair


@pytest.mark.parametrize("visible", ["", "-1"])
def test_hidden_gpus_mean_a_cpu_worker(monkeypatch, scontrol, visible):
    # Upstream counts CUDA_VISIBLE_DEVICES="" as 1 GPU and would set it to "0".
    scontrol(["n1", "n2"])
    slurm_step(monkeypatch, procid=0, tasks=2, nodelist="n[1-2]", tasks_per_node="1(x2)")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    resolver = slurm.slurm_resolver()
    resolver.cluster_spec()
    assert resolver.num_accelerators() == {"GPU": 0}
    assert os.environ["CUDA_VISIBLE_DEVICES"] == visible


def test_more_tasks_than_gpus_on_a_node_says_how_to_fix_it(monkeypatch, scontrol):
    scontrol(["g1"])
    slurm_step(monkeypatch, procid=0, tasks=2, nodelist="g1", tasks_per_node="2")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    with pytest.raises(ValueError, match=r"SLURM runs 2 tasks on a node with 1 visible GPU\(s\)"
                       r".*Received: .*CUDA_VISIBLE_DEVICES='0'\. Use at most one task per GPU"):
        slurm.slurm_resolver()


def test_upstream_still_cannot_resolve_a_node_without_gpus(monkeypatch):
    # Why slurm_nodes.py builds CPU workers itself (CpuSlurmClusterResolver): when this fails,
    # TensorFlow handles nodes without GPUs and that class can go.
    slurm_step(monkeypatch, procid=0, tasks=2, nodelist="n[1-2]", tasks_per_node="1(x2)")
    with pytest.raises(FileNotFoundError):  # nvidia-smi is not on PATH
        SlurmClusterResolver()
    with pytest.raises(ValueError, match=r"range\(\) arg 3 must not be zero"):
        SlurmClusterResolver(gpus_per_node=0).cluster_spec()


# --- from_env and the chief ----------------------------------------------------------


class RecordedStrategy:
    """Stands in for MultiWorkerMirroredStrategy, which cannot start in this process."""

    def __init__(self, cluster_resolver=None, communication_options=None):
        self.cluster_resolver = cluster_resolver
        self.communication_options = communication_options


def test_from_env_under_a_step_of_several_tasks_uses_the_slurm_resolver(monkeypatch, scontrol):
    scontrol(["n1", "n2"])
    slurm_step(monkeypatch, procid=1, tasks=2, nodelist="n[1-2]", tasks_per_node="1(x2)")
    monkeypatch.setattr(tf.distribute, "MultiWorkerMirroredStrategy", RecordedStrategy)
    strategy = sk.from_env(cross_device_ops="nccl")
    assert isinstance(strategy.cluster_resolver, SlurmClusterResolver)
    strategy.cluster_resolver.cluster_spec()  # sets task_type and task_id, as upstream does
    assert strategy.cluster_resolver.task_id == 1
    implementation = strategy.communication_options.implementation
    assert implementation == tf.distribute.experimental.CommunicationImplementation.NCCL


def test_from_env_under_slurm_rejects_cross_device_ops_that_do_not_span_workers(
        monkeypatch, scontrol):
    scontrol(["n1", "n2"])
    slurm_step(monkeypatch, procid=0, tasks=2, nodelist="n[1-2]", tasks_per_node="1(x2)")
    with pytest.raises(ValueError, match=r"Across several workers cross_device_ops must be"):
        sk.from_env(cross_device_ops="reduce_to_one_device")


def test_tf_config_wins_over_slurm(monkeypatch, scontrol):
    scontrol(["n1", "n2"])
    slurm_step(monkeypatch, procid=0, tasks=2, nodelist="n[1-2]", tasks_per_node="1(x2)")
    config = {"cluster": {"worker": ["localhost:1", "localhost:2"]},
              "task": {"type": "worker", "index": 1}}
    monkeypatch.setenv("TF_CONFIG", json.dumps(config))
    monkeypatch.setattr(tf.distribute, "MultiWorkerMirroredStrategy", RecordedStrategy)
    resolver = sk.from_env().cluster_resolver  # TensorFlow's reader of TF_CONFIG
    assert isinstance(resolver, tf.distribute.cluster_resolver.TFConfigClusterResolver)
    assert (resolver.task_type, resolver.task_id) == ("worker", 1)
    assert (is_chief(), worker_index()) == (False, 1)  # TF_CONFIG's task, not SLURM's
    config["cluster"]["worker"] = ["localhost:1"]
    config["task"]["index"] = 0
    monkeypatch.setenv("TF_CONFIG", json.dumps(config))
    strategy = sk.from_env()  # one worker in TF_CONFIG: one machine, whatever SLURM says
    assert type(strategy) is tf.distribute.MirroredStrategy


def test_a_one_task_step_is_one_machine(monkeypatch):
    slurm_step(monkeypatch, procid=0, tasks=1, nodelist="n1", tasks_per_node="1")
    strategy = sk.from_env()
    assert type(strategy) is tf.distribute.MirroredStrategy
    assert strategy.num_replicas_in_sync == 1
    assert (is_chief(), worker_index()) == (True, 0)


@pytest.mark.parametrize(("procid", "chief"), [(0, True), (1, False), (3, False)])
def test_the_chief_is_task_zero(monkeypatch, procid, chief):
    # No scontrol on PATH: which worker this is needs SLURM_PROCID only.
    slurm_step(monkeypatch, procid=procid, tasks=4, nodelist="n[1-2]", tasks_per_node="2(x2)")
    assert is_chief() is chief
    assert worker_index() == procid


# --- two real workers ----------------------------------------------------------------

_WORKER = """
import json
import tensorflow as tf
import strategykit as sk
from strategykit.cluster.roles import is_chief, worker_index

strategy = sk.from_env()


@tf.function
def step():
    context = tf.distribute.get_replica_context()
    return tf.cast(context.replica_id_in_sync_group + 1, tf.float32)


total = strategy.reduce("SUM", strategy.run(step), axis=None)
resolver = strategy.cluster_resolver
print(json.dumps({
    "multi_worker": isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy),
    "replicas": strategy.num_replicas_in_sync,
    "total": float(total),
    "cluster": resolver.cluster_spec().as_dict(),
    "task": [resolver.task_type, resolver.task_id],
    "chief": [is_chief(), is_chief(strategy)],
    "index": [worker_index(), worker_index(strategy)],
    "describe": sk.describe(strategy),
}))
"""


def two_free_ports() -> int:
    """A port p such that p and p + 1 are free (two tasks on one node use both)."""
    for _ in range(50):
        with socket.socket() as first, socket.socket() as second:
            first.bind(("localhost", 0))
            port = first.getsockname()[1]
            if port >= 65535:
                continue
            try:
                second.bind(("localhost", port + 1))
            except OSError:
                continue
            return port
    raise RuntimeError("found no two consecutive free ports")


def test_two_slurm_tasks_all_reduce_across_processes(tmp_path):
    # `srun -n 2` on one node, simulated: both tasks on "localhost", consecutive ports.
    script = tmp_path / "worker.py"
    script.write_text(_WORKER)
    directory = fake_scontrol(tmp_path / "slurm_bin", ["localhost"])
    port = two_free_ports()
    base = {name: value for name, value in os.environ.items()
            if not name.startswith(("SLURM_", "SLURMD_"))
            and name not in ("TF_CONFIG", "CUDA_VISIBLE_DEVICES")}
    base.update({
        "PATH": f"{directory}{os.pathsep}{_PATH}",
        "TF_CPP_MIN_LOG_LEVEL": "2", PORT_VARIABLE: str(port),
        "SLURM_STEP_NUM_TASKS": "2", "SLURM_NTASKS": "2", "SLURM_STEP_NODELIST": "localhost",
        "SLURM_STEP_TASKS_PER_NODE": "2", "SLURM_STEP_NUM_NODES": "1", "SLURM_NODEID": "0",
        "SLURMD_NODENAME": "localhost", "SLURM_JOB_ID": "1234", "SLURM_STEP_ID": "0",
    })
    envs = [{**base, "SLURM_PROCID": str(task), "SLURM_LOCALID": str(task)} for task in range(2)]
    finished = run_processes(str(script), envs, timeout=120)
    for task, worker in enumerate(finished):
        report = worker.last_json()
        assert report["multi_worker"] is True
        assert report["replicas"] == 2
        assert report["total"] == 1.0 + 2.0
        assert report["cluster"] == {"worker": [f"localhost:{port}", f"localhost:{port + 1}"]}
        assert report["task"] == ["worker", task]
        assert report["chief"] == [task == 0, task == 0]
        assert report["index"] == [task, task]
        assert report["describe"]["workers"] == 2
