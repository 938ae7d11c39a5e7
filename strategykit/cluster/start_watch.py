"""A worker's watch over the cluster's start: peers that never connect are named.

Building a `MultiWorkerMirroredStrategy` waits, silently and without end, until every
task of the cluster has connected to TensorFlow's coordination service. A worker that
was never started (a `TF_CONFIG` naming a task nobody runs, a peer on a machine whose
port is blocked) leaves the others waiting forever. While `sk.from_env()` builds the
strategy, `watching_start` probes each peer's port from a small process of its own;
every `REPORT_SECONDS` it says on stderr which workers have not connected and what to
check, and after `STRATEGYKIT_START_TIMEOUT` seconds (default 300, 0: wait forever) the
worker exits with code 1, so the job fails instead of hanging. Standard library only
(the watcher runs this file as a script).
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Mapping

START_TIMEOUT_VARIABLE = "STRATEGYKIT_START_TIMEOUT"
"""Seconds a worker waits for the cluster to form before it exits with code 1."""

DEFAULT_START_TIMEOUT = 300.0
"""The start timeout without `STRATEGYKIT_START_TIMEOUT`."""

REPORT_SECONDS = 30.0
"""How often a worker still waiting for its peers says so."""

_PROBE_SECONDS = 1.0


def start_timeout(environ: Mapping[str, str] | None = None) -> float:
    """`STRATEGYKIT_START_TIMEOUT` in seconds; 300 when unset, 0: no timeout.

    Raises:
        ValueError: a value that is not a number of seconds >= 0.

    Example:
        >>> start_timeout({}), start_timeout({"STRATEGYKIT_START_TIMEOUT": "20"})
        (300.0, 20.0)
    """
    from strategykit.cluster.seconds_variable import read_seconds  # not in the watcher

    return read_seconds(os.environ if environ is None else environ, START_TIMEOUT_VARIABLE,
                        DEFAULT_START_TIMEOUT, off="to wait for the workers without end")


def peers(cluster: Mapping[str, list], task_type: str, index: int) -> dict[str, str]:
    """Every other task of `cluster` by name (`"worker 1"`, `"chief 0"`) -> its address.

    Example:
        >>> peers({"chief": ["c:1"], "worker": ["w:1", "w:2"]}, "worker", 0)
        {'chief 0': 'c:1', 'worker 1': 'w:2'}
    """
    return {f"{kind} {i}": address for kind in ("chief", "worker")
            for i, address in enumerate(cluster.get(kind) or ())
            if (kind, i) != (task_type, index)}


def unreachable(addresses: Mapping[str, str]) -> list[str]:
    """The names of `addresses` whose `host:port` accepts no connection now."""
    missing = []
    for name, address in addresses.items():
        host, _, port = address.rpartition(":")
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=1).close()
        except OSError:
            missing.append(name)
    return missing


def waiting_message(me: str, addresses: Mapping[str, str], missing: list[str],
                    waited: float, timeout: float) -> str:
    """What a worker waiting `waited` seconds for its peers says."""
    if missing:
        names = ", ".join(f"{name} ({addresses[name]})" for name in missing)
        their = "its" if len(missing) == 1 else "their"
        what = f"{names} never connected: nothing answers at {their} address"
    else:
        what = "every peer's port answers, but the cluster has not formed"
    end = (f"exiting with code 1 after {timeout:g} s" if timeout
           else "waiting without end")
    return (f"strategykit: {me} has waited {waited:.0f} s for the cluster: {what}. Check "
            "that every worker of TF_CONFIG's cluster was started, each with the same "
            "cluster and its own task, and that their ports are reachable from this "
            f"machine (a firewall, a wrong host name). {START_TIMEOUT_VARIABLE}={timeout:g} "
            f"({end}; set it to change).")


@contextlib.contextmanager
def watching_start(me: str, addresses: Mapping[str, str], *, timeout: float | None = None,
                   report: float = REPORT_SECONDS):
    """Watches the body (the strategy being built) until it returns.

    TensorFlow holds Python's lock while it waits for the cluster, so no thread of this
    process runs: the watch is a small process of its own (this file run as a script,
    standard library only), and the timeout is `faulthandler`'s (which needs no lock;
    any `faulthandler.dump_traceback_later` of yours is cancelled meanwhile).

    Args:
        me: this worker, e.g. `"worker 0"`, for the messages.
        addresses: every peer by name -> address (`peers`).
        timeout: seconds before the process exits with code 1; default
            `start_timeout()`; 0: never.
        report: seconds between two messages while waiting.
    """
    timeout = start_timeout() if timeout is None else timeout
    arguments = json.dumps([me, dict(addresses), timeout, report, os.getpid()])
    try:
        watcher = subprocess.Popen([sys.executable, "-I", os.path.abspath(__file__),
                                    arguments], stdin=subprocess.DEVNULL,
                                   stdout=subprocess.DEVNULL)
    except OSError:  # no interpreter to run (an embedded Python): the timeout alone
        watcher = None
    sink = open(os.devnull, "w")
    if timeout:  # the watcher has said why just before
        faulthandler.dump_traceback_later(timeout + 1, exit=True, file=sink)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
        sink.close()
        if watcher is not None:
            watcher.kill()
            watcher.wait()


def _watch(me: str, addresses: Mapping[str, str], timeout: float, report: float,
           parent: int) -> None:
    """The watcher process: messages every `report` s and at `timeout`, while `parent`
    lives."""
    start = time.monotonic()
    next_report = start + min(report, timeout or report)
    while os.getppid() == parent:
        time.sleep(_PROBE_SECONDS)
        now = time.monotonic()
        timed_out = bool(timeout) and now - start >= timeout
        if now < next_report and not timed_out:
            continue
        print(waiting_message(me, addresses, unreachable(addresses), now - start, timeout),
              file=sys.stderr, flush=True)
        if timed_out:
            return
        next_report = now + report


if __name__ == "__main__":
    _watch(*json.loads(sys.argv[1]))
