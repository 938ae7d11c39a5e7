"""The port a worker listens on, set the same way in every environment that builds addresses.

Where strategykit builds the workers' addresses itself (a SLURM job step, a Kubernetes
Indexed Job or JobSet), each worker listens on the port `STRATEGYKIT_PORT` (default
8888: TensorFlow's `SlurmClusterResolver` `port_base`, and the `containerPort` of
`examples/kubernetes/`); under SLURM the tasks of one node use it and the ports after
it. `TF_CONFIG` names its own ports, and `strategykit launch` picks free ones (its
`--port`), so neither reads this.

Example:
    >>> read_port({}, fix="")
    8888
    >>> read_port({"STRATEGYKIT_PORT": "23456"}, fix="")
    23456
"""

from __future__ import annotations

from collections.abc import Mapping

PORT_VARIABLE = "STRATEGYKIT_PORT"
"""The environment variable that sets the port every worker (or a node's first) listens on."""

DEFAULT_PORT = 8888
"""The port without `STRATEGYKIT_PORT`: SlurmClusterResolver's default `port_base`."""

_HIGHEST_PORT = 65535


def read_port(environ: Mapping[str, str], *, fix: str, port: int | None = None,
              span: int = 1, what: str = PORT_VARIABLE, span_note: str = "") -> int:
    """The first port of the workers on a machine: `port`, else `STRATEGYKIT_PORT`, else 8888.

    Args:
        environ: the process environment to read.
        fix: the end of the error message: what to set instead.
        port: a port given in code; default None: read `STRATEGYKIT_PORT`.
        span: how many ports from it the workers on one machine use (default 1).
        what: how the message names the port; default `"STRATEGYKIT_PORT"`.
        span_note: why `span` ports are used, in the message (default none).

    Returns:
        The port, from 1 to `65536 - span`.

    Raises:
        ValueError: the port is not an integer from 1 to `65536 - span`; the message
            names it, what was received, and ends in `fix`.
    """
    source = f"port={port!r}"
    if port is None:
        raw = environ.get(PORT_VARIABLE, "").strip()
        if not raw:
            return DEFAULT_PORT
        source = f"{PORT_VARIABLE}={raw!r}"
        port = int(raw) if raw.isdecimal() else None
    highest = _HIGHEST_PORT + 1 - span
    if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= highest:
        note = f" ({span_note})" if span_note else ""
        raise ValueError(f"{what} must be an integer from 1 to {highest}{note}. Received: "
                         f"{source}. {fix}")
    return port
