"""Workers at public addresses: found in `TF_CONFIG`, and warned about once.

TensorFlow's distributed runtime serves each worker's gRPC port on every network
interface, without authentication or encryption: whoever can reach the port can run
operations on that worker as the job's user, e.g. `tf.io.read_file` placed on
`/job:worker/task:0` reads that user's files. strategykit cannot close the ports of a job
across machines, so `sk.from_env()` says it when `TF_CONFIG` puts a worker at a public
address (README, section "Security"). Standard library only.
"""

from __future__ import annotations

import ipaddress
import socket
import warnings
from typing import NamedTuple


class PublicAddress(NamedTuple):
    """A worker of the cluster whose host is public.

    Attributes:
        task_type: the worker's task type in `TF_CONFIG`: `"chief"`, `"worker"`, ...
        index: its index among the tasks of that type.
        address: its `host:port` as `TF_CONFIG` gives it.
        ip: the public IP address of the host: the host itself for an IP literal, the
            address it resolves to for a name.
    """

    task_type: str
    index: int
    address: str
    ip: str

    def describe(self) -> str:
        """`worker 1 at host:port`, with the resolved IP after a name."""
        named = "" if self.ip == _host(self.address) else f" ({self.ip})"
        return f"{self.task_type} {self.index} at {self.address}{named}"


_warned: set[PublicAddress] = set()  # what this process has warned about already


def public_addresses(config: dict) -> list[PublicAddress]:
    """The workers of a `TF_CONFIG` cluster whose host is public.

    Every task type of the cluster counts (chief, worker, evaluator, ps, ...). A host is
    public when it is an IP literal (IPv4, or IPv6 in brackets: `[2001:db8::1]:2222`)
    that is global, or a name that resolves to a global address (`socket.getaddrinfo`,
    once per distinct name). Loopback, private (10/8, 172.16/12, 192.168/16, fc00::/7),
    link-local, shared (100.64/10) and documentation addresses are not public; nor is a
    name that does not resolve.

    Args:
        config: a checked `TF_CONFIG` dict, as
            `strategykit.cluster.environments.tf_config.read_tf_config()` returns it.

    Returns:
        The public workers, in the cluster's order; empty without a cluster.

    Example:
        >>> config = {"cluster": {"chief": ["8.8.8.8:2222"],
        ...                       "worker": ["10.0.0.2:2222", "[2001:4860:4860::8888]:2222"]},
        ...           "task": {"type": "chief", "index": 0}}
        >>> [found.describe() for found in public_addresses(config)]
        ['chief 0 at 8.8.8.8:2222', 'worker 1 at [2001:4860:4860::8888]:2222']
    """
    resolved: dict[str, str | None] = {}
    found = []
    for task_type, addresses in (config.get("cluster") or {}).items():
        for index, address in enumerate(addresses):
            if address is None:  # not known yet (SLURM's node list): nothing to check
                continue
            host = _host(str(address))
            if host not in resolved:
                resolved[host] = _public_ip(host)
            if resolved[host] is not None:
                found.append(PublicAddress(task_type, index, str(address), resolved[host]))
    return found


def warn_if_public(config: dict, *, stacklevel: int = 2) -> None:
    """Warns, once a process, when a worker of `TF_CONFIG` is at a public address.

    The `UserWarning` names each public worker (see `public_addresses`), what is exposed
    and what to do. An address warned about once is not warned about again.

    Args:
        config: a checked `TF_CONFIG` dict, as
            `strategykit.cluster.environments.tf_config.read_tf_config()` returns it.
        stacklevel: as for `warnings.warn`; default 2, the line that calls this.

    Example:
        >>> import warnings
        >>> config = {"cluster": {"worker": ["8.8.8.8:2222", "10.0.0.2:2222"]},
        ...           "task": {"type": "worker", "index": 1}}
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     warn_if_public(config)
        ...     warn_if_public(config)  # the same addresses: nothing more
        >>> len(caught), "worker 0 at 8.8.8.8:2222" in str(caught[0].message)
        (1, True)
    """
    new = [found for found in public_addresses(config) if found not in _warned]
    if not new:
        return
    _warned.update(new)
    warnings.warn(
        f"TF_CONFIG puts workers at public addresses: "
        f"{', '.join(found.describe() for found in new)}. TensorFlow serves each worker's "
        "port on every network interface without authentication: anyone who can reach "
        "such a host:port can read and write this user's files. Keep the workers "
        "on a private network or behind a firewall that admits only the other workers; "
        "see the README section 'Security'.",
        UserWarning,
        stacklevel=stacklevel,
    )


def _host(address: str) -> str:
    """The host of `host:port`, `[ipv6]:port` or a bare host, without brackets."""
    if address.startswith("["):
        return address[1:].partition("]")[0]
    if address.count(":") == 1:
        return address.partition(":")[0]
    return address


def _public_ip(host: str) -> str | None:
    """The first global address `host` is or resolves to; None when it has none."""
    ips = [host]
    try:
        ipaddress.ip_address(host)
    except ValueError:  # a name
        try:
            ips = [info[4][0] for info in socket.getaddrinfo(host, None)]
        except (OSError, UnicodeError):  # socket.gaierror is an OSError
            return None
    return next((ip for ip in ips if ipaddress.ip_address(ip).is_global), None)
