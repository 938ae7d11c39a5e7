"""Workers at public addresses: which hosts count as public, and the one warning.

Names resolve through a fake `socket.getaddrinfo` (no DNS); nothing starts TensorFlow's
runtime: the `sk.from_env()` test stops right after the warning.
"""

import json
import socket
import warnings

import pytest

import strategykit as sk
from strategykit.cluster import public_address
from strategykit.cluster.public_address import PublicAddress, public_addresses, warn_if_public
from strategykit.strategy import build

NAMES = {
    "localhost": ["127.0.0.1", "::1"],
    "node1.example.com": ["10.0.0.1", "8.8.4.4"],  # a private and a public address
    "node2.example.com": ["192.168.0.2"],
    "v6.example.com": ["fe80::1%eth0", "2001:4860:4860::8844"],
}


@pytest.fixture(autouse=True)
def fresh_process(monkeypatch):
    """No address warned about yet; names resolve from NAMES only, each lookup recorded."""
    monkeypatch.setattr(public_address, "_warned", set())
    lookups = []

    def getaddrinfo(host, port, *args, **kwargs):
        lookups.append(host)
        if host not in NAMES:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [(socket.AF_INET6 if ":" in ip else socket.AF_INET, socket.SOCK_STREAM, 6, "",
                 (ip, 0, 0, 0) if ":" in ip else (ip, 0)) for ip in NAMES[host]]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return lookups


def tf_config(**cluster):
    first = next(iter(cluster))
    return {"cluster": cluster, "task": {"type": first, "index": 0}}


def warning_of(config) -> str:
    """The one warning `warn_if_public(config)` gives, from this file's line."""
    with pytest.warns(UserWarning) as record:
        warn_if_public(config)
    assert len(record) == 1
    assert record[0].filename == __file__
    return str(record[0].message)


def no_warning(config) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_if_public(config)


def test_a_public_ipv4_worker_is_named_with_what_is_exposed_and_the_fix():
    message = warning_of(tf_config(chief=["10.0.0.2:2222"], worker=["8.8.8.8:2222"]))
    assert message.startswith("TF_CONFIG puts workers at public addresses: "
                              "worker 0 at 8.8.8.8:2222. ")
    assert "10.0.0.2" not in message
    assert ("TensorFlow serves each worker's port on every network interface without "
            "authentication") in message
    assert "read and write this user's files" in message
    assert "private network or behind a firewall that admits only the other workers" in message
    assert "see the README section 'Security'" in message


@pytest.mark.parametrize("task_type", ["chief", "worker", "evaluator", "ps"])
def test_every_task_type_counts_and_ipv6_in_brackets(task_type):
    config = tf_config(**{"worker": ["127.0.0.1:2222"],
                          task_type: ["[::1]:2223", "[2001:4860:4860::8888]:2222"]})
    assert public_addresses(config) == [
        PublicAddress(task_type, 1, "[2001:4860:4860::8888]:2222", "2001:4860:4860::8888")]
    assert f"{task_type} 1 at [2001:4860:4860::8888]:2222." in warning_of(config)


@pytest.mark.parametrize("address", [
    "127.0.0.1:2222", "localhost:2222", "[::1]:2222", "10.1.2.3:2222", "172.16.0.5:2222",
    "172.31.255.1:2222", "192.168.1.7:2222", "169.254.1.1:2222", "100.64.0.1:2222",
    "[fd00::1]:2222", "[fe80::1]:2222", "203.0.113.5:2222", "node2.example.com:2222",
    "nowhere.invalid:2222",
])
def test_loopback_private_link_local_shared_unresolvable_are_not_public(address):
    config = tf_config(worker=[address, "[::1]:2223"])
    assert public_addresses(config) == []
    no_warning(config)


def test_a_name_that_resolves_to_a_public_address_is_named_with_that_address():
    config = tf_config(worker=["node2.example.com:2222", "node1.example.com:2222",
                               "v6.example.com:2222"])
    assert public_addresses(config) == [
        PublicAddress("worker", 1, "node1.example.com:2222", "8.8.4.4"),
        PublicAddress("worker", 2, "v6.example.com:2222", "2001:4860:4860::8844"),
    ]
    assert ("public addresses: worker 1 at node1.example.com:2222 (8.8.4.4), worker 2 at "
            "v6.example.com:2222 (2001:4860:4860::8844). ") in warning_of(config)


def test_each_name_is_resolved_once_and_ip_literals_not_at_all(fresh_process):
    config = tf_config(chief=["node1.example.com:2222"],
                       worker=["node1.example.com:2223", "nowhere.invalid:2222",
                               "nowhere.invalid:2223", "8.8.8.8:2222", "[::1]:2222"])
    assert [found.index for found in public_addresses(config)] == [0, 0, 3]
    assert fresh_process == ["node1.example.com", "nowhere.invalid"]


def test_an_address_is_warned_about_once_a_process():
    config = tf_config(worker=["8.8.8.8:2222", "10.0.0.2:2222"])
    warning_of(config)
    no_warning(config)
    more = tf_config(worker=["8.8.8.8:2222", "1.1.1.1:2222"])
    assert "addresses: worker 1 at 1.1.1.1:2222. " in warning_of(more)  # only the new one


def test_from_env_warns_from_the_callers_line_before_it_starts_the_workers(monkeypatch):
    class Stopped(Exception):
        pass

    def stop(worker):
        raise Stopped  # what follows starts the job's workers: not in this test

    monkeypatch.setenv("TF_CONFIG", json.dumps(tf_config(worker=["8.8.8.8:2222",
                                                                "10.0.0.2:2222"])))
    monkeypatch.setattr(build, "_report_progress", stop)
    with pytest.warns(UserWarning, match=r"worker 0 at 8\.8\.8\.8:2222\. ") as record:
        with pytest.raises(Stopped):
            sk.from_env()
    assert [warning.filename for warning in record] == [__file__]
