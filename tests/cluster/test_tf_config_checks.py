"""A malformed `TF_CONFIG` is refused before TensorFlow sees it: a string where the
addresses' list belongs, an address that is not host:port, two tasks at one address,
bad JSON, a task out of range (`cluster_addresses`, `tf_config`)."""

import json
import re

import pytest

from strategykit.cluster.environments import TFConfig


def _workers(cluster, task=None):
    config = {"cluster": cluster, "task": task or {"type": "worker", "index": 0}}
    return TFConfig({"TF_CONFIG": json.dumps(config)}).workers()


def test_a_string_of_one_address_is_not_15_workers():
    with pytest.raises(ValueError, match=re.escape(
            "TF_CONFIG field 'cluster.worker' must be a list of \"host:port\" strings, one "
            "per task. Received: cluster.worker='localhost:1234' (a str). Use "
            '"worker": ["localhost:1234"].')):
        _workers({"worker": "localhost:1234"})


@pytest.mark.parametrize("address", ["localhost", "localhost:", "localhost:port",
                                     "localhost:0", "localhost:65536", ":2222", 2222, None])
def test_every_address_is_host_and_port(address):
    with pytest.raises(ValueError, match=re.escape(
            "TF_CONFIG field 'cluster.worker[1]' must be a \"host:port\" string with an "
            f"integer port from 1 to 65535. Received: cluster.worker[1]={address!r}. Use "
            'e.g. "host1:12345".')):
        _workers({"worker": ["localhost:2222", address]})


def test_addresses_of_every_kind_are_accepted():
    cluster = {"chief": ["c.example:2222"], "worker": ["10.0.0.5:1", "[::1]:65535"]}
    assert _workers(cluster) == 3


def test_two_tasks_at_one_address_are_refused_naming_both():
    cluster = {"chief": ["localhost:2222"], "worker": ["localhost:2223", "localhost:2222"]}
    with pytest.raises(ValueError, match=re.escape(
            "TF_CONFIG gives two tasks the same address: chief 0 and worker 1 are both at "
            "'localhost:2222', so neither can start its server. Received: cluster=")) as error:
        _workers(cluster)
    assert str(error.value).endswith("Give each task a port (or host) of its own.")


@pytest.mark.parametrize("first, second", [("localhost:2222", "127.0.0.1:2222"),
                                           ("[::1]:2222", "LOCALHOST:2222"),
                                           ("127.0.0.1:2222", "127.0.1.1:2222")])
def test_two_loopback_spellings_of_one_port_are_one_address(first, second):
    with pytest.raises(ValueError, match=re.escape(
            f"TF_CONFIG gives two tasks the same address: worker 0 and worker 1 are both at "
            f"{first!r} and {second!r}, one port of this machine, so neither can start its "
            "server. Received: cluster=")):
        _workers({"worker": [first, second]})
    assert _workers({"worker": [first, second.replace("2222", "2223")]}) == 2


def test_json_that_does_not_parse_names_the_variable():
    with pytest.raises(ValueError, match=r"^TF_CONFIG is not valid JSON \(.*\)\. Received: "
                                         r"TF_CONFIG='\{cluster: 1\}'\. Set it to e\.g\. "):
        TFConfig({"TF_CONFIG": "{cluster: 1}"}).workers()


@pytest.mark.parametrize("task, message", [
    ({"type": "worker", "index": 2}, "Received: task.index=2; the cluster has 2 'worker' "
                                     "task(s), so use 0 to 1."),
    ({"type": "worker", "index": -1}, "Received: task.index=-1;"),
    ({"type": "chief", "index": 0}, "Received: task.type='chief'; the cluster has "
                                    "['worker']."),
])
def test_the_task_is_one_of_the_cluster(task, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        _workers({"worker": ["a:1", "b:1"]}, task)
