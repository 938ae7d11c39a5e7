"""This worker's port, checked free before TensorFlow starts its server on it.

TensorFlow's gRPC server listens on the worker's port on every interface; when the port
is taken on this machine (another job, a leftover worker, `strategykit launch
--network=host` beside a service) it says only "Could not start gRPC server". So
`sk.from_env()` first binds the port itself, as TensorFlow will, and closes it again;
a port in use is a `RuntimeError` naming the port, the worker and the fix. Standard
library only.

Example:
    >>> check_port_free("localhost:0", "worker 0")  # port 0: any free port, never taken
"""

from __future__ import annotations

import errno
import socket


def check_port_free(address: str, worker: str) -> None:
    """Refuses a port of this worker's `address` (`"host:port"`) that is already in use.

    Args:
        address: this worker's address in the cluster; only its port is bound, on every
            interface, as TensorFlow's server does.
        worker: how the message names this worker, e.g. `"worker 1"`.

    Raises:
        RuntimeError: the port is in use on this machine.
    """
    port = int(address.rpartition(":")[2])
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("0.0.0.0", port))
        except OSError as error:
            if error.errno != errno.EADDRINUSE:
                return  # e.g. no IPv4 here: TensorFlow says what it finds
            raise RuntimeError(
                f"Port {port} of {worker} (its address {address!r} in the cluster) is "
                "already in use on this machine, so TensorFlow cannot start the worker's "
                f"server there. Free the port (e.g. `ss -ltnp 'sport = :{port}'` shows who "
                "holds it: a leftover worker, another job), or give this worker another "
                "port in TF_CONFIG (the same on every worker); under `strategykit launch "
                "--network=host` run it again without --port (it picks free ports) or "
                "with another --port.") from None
