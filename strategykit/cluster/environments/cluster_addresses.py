"""The addresses of a `TF_CONFIG` cluster, checked before TensorFlow sees them.

TensorFlow takes a task type's addresses as a sequence, so a string (`"worker":
"localhost:1234"`) is 15 workers of one character each; an address without a port, or
two tasks at one address, make every worker wait for peers that can never connect.
TensorFlow's server listens on its port at every address of its machine, so two
loopback spellings of one port (`localhost:2222`, `127.0.0.1:2222`) are one address.
`check_cluster` refuses each at once, naming the key, what was received and the fix.

Example:
    >>> check_cluster({"worker": ["host1:12345", "host2:12345"]})
    >>> check_cluster({"worker": "host1:12345"})  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: TF_CONFIG field 'cluster.worker' must be a list of "host:port" strings, ...
"""

from __future__ import annotations

from collections.abc import Mapping

_HIGHEST_PORT = 65535
_EXAMPLE = '"worker": ["host1:12345", "host2:12345"]'


def check_cluster(cluster: Mapping) -> None:
    """Checks every task type's addresses of a `TF_CONFIG` cluster.

    Raises:
        ValueError: a task type's value is not a list, an address is not a
            `"host:port"` string with an integer port from 1 to 65535, or two tasks
            share an address; the message names the key, what was received and the fix.
    """
    seen: dict[tuple[str, str], tuple[str, str]] = {}  # (machine, port) -> task, address
    for kind, addresses in cluster.items():
        key = f"cluster.{kind}"
        if not isinstance(addresses, list):
            example = f'"{kind}": [{addresses!r}]'.replace("'", '"') if isinstance(
                addresses, str) else _EXAMPLE
            raise ValueError(
                f"TF_CONFIG field {key!r} must be a list of \"host:port\" strings, one per "
                f"task. Received: {key}={addresses!r} (a {type(addresses).__name__}). Use "
                f"{example}.")
        for index, address in enumerate(addresses):
            _check_address(f"{key}[{index}]", address)
            task, place = f"{kind} {index}", _machine_and_port(address)
            if place in seen:
                other, spelled = seen[place]
                where = f"{address!r}" if spelled == address else (
                    f"{spelled!r} and {address!r}, one port of this machine")
                raise ValueError(
                    f"TF_CONFIG gives two tasks the same address: {other} and {task} are "
                    f"both at {where}, so neither can start its server. Received: "
                    f"cluster={dict(cluster)!r}. Give each task a port (or host) of its own.")
            seen[place] = task, address


def _machine_and_port(address: str) -> tuple[str, str]:
    """`(host, port)` of a checked address, every loopback spelling one host."""
    host, port = address.rpartition(":")[::2]
    host = host.strip("[]").lower()
    loopback = host in ("localhost", "::1", "0.0.0.0", "::") or host.startswith("127.")
    return ("loopback" if loopback else host), port


def _check_address(key: str, address) -> None:
    host, port = (address.rpartition(":")[::2] if isinstance(address, str) else ("", ""))
    if host.startswith("[") and host.endswith("]"):  # [::1]:2222
        host = host[1:-1]
    if host and port.isdecimal() and 1 <= int(port) <= _HIGHEST_PORT:
        return
    raise ValueError(
        f"TF_CONFIG field {key!r} must be a \"host:port\" string with an integer port "
        f"from 1 to {_HIGHEST_PORT}. Received: {key}={address!r}. Use e.g. "
        '"host1:12345".')
