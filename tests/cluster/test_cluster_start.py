"""A cluster that cannot form fails with a message instead of hanging: a worker named in
`TF_CONFIG` that is never started (`start_watch`), a port already in use on this machine
(`own_port`). Real processes on loopback, each killed with its process group at the
test's timeout (`workers.run_processes`)."""

import json
import os
import socket

from strategykit.cluster import start_watch
from strategykit.launcher.worker_env import free_ports

from workers import run_processes

SCRIPT = """
import strategykit as sk
sk.from_env()
print("built", flush=True)
"""


def _envs(addresses, indices, **extra):
    cluster = {"worker": addresses}
    return [{**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **extra, "TF_CONFIG": json.dumps(
        {"cluster": cluster, "task": {"type": "worker", "index": i}})} for i in indices]


def test_a_worker_never_started_is_named_and_the_others_fail(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(SCRIPT)
    addresses = [f"localhost:{port}" for port in free_ports(3)]
    finished = run_processes(str(script), _envs(addresses, [0, 1], STRATEGYKIT_START_TIMEOUT="4"),
                             timeout=60, check=False)
    for worker in finished:
        assert worker.returncode == 1, worker
        assert "built" not in worker.stdout
        assert (f"strategykit: worker {worker.index} has waited 4 s for the cluster: worker 2 "
                f"({addresses[2]}) never connected: nothing answers at its address. Check that "
                "every worker of TF_CONFIG's cluster was started, each with the same cluster "
                "and its own task, and that their ports are reachable from this machine (a "
                "firewall, a wrong host name). STRATEGYKIT_START_TIMEOUT=4 (exiting with code "
                "1 after 4 s; set it to change).") in worker.stderr, worker.stderr[-3000:]


def test_a_port_in_use_names_the_port_the_worker_and_the_fix(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(SCRIPT)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        addresses = [f"localhost:{free_ports(1)[0]}", f"localhost:{port}"]
        [worker] = run_processes(str(script), _envs(addresses, [1]), timeout=60, check=False)
    assert worker.returncode == 1, worker
    assert (f"RuntimeError: Port {port} of worker 1 (its address 'localhost:{port}' in the "
            "cluster) is already in use on this machine, so TensorFlow cannot start the "
            f"worker's server there. Free the port (e.g. `ss -ltnp 'sport = :{port}'` shows "
            "who holds it") in worker.stderr, worker.stderr[-3000:]
    assert "--network=host` run it again without --port" in worker.stderr


def test_the_start_timeout_is_read_and_checked():
    assert start_watch.start_timeout({}) == 300
    assert start_watch.start_timeout({"STRATEGYKIT_START_TIMEOUT": "0"}) == 0
    try:
        start_watch.start_timeout({"STRATEGYKIT_START_TIMEOUT": "soon"})
    except ValueError as error:
        assert str(error) == (
            "STRATEGYKIT_START_TIMEOUT must be a number of seconds >= 0. Received: "
            "STRATEGYKIT_START_TIMEOUT='soon'. Use e.g. STRATEGYKIT_START_TIMEOUT=600, or 0 "
            "to wait for the workers without end.")
    else:
        raise AssertionError("no ValueError")


def test_while_peers_answer_the_message_says_the_cluster_has_not_formed():
    message = start_watch.waiting_message("worker 1", {"worker 0": "a:1"}, [], 30, 0)
    assert "worker 1 has waited 30 s for the cluster: every peer's port answers, but the " \
           "cluster has not formed. Check that every worker" in message
    assert message.endswith("STRATEGYKIT_START_TIMEOUT=0 (waiting without end; set it to "
                            "change).")
