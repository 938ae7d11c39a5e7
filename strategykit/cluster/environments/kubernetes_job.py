"""A Kubernetes Indexed Job with a headless Service: one worker a pod.

Kubernetes starts pod k of an Indexed Job (`completionMode: Indexed`) with
`JOB_COMPLETION_INDEX=k` and the hostname `<job>-<k>` (in `HOSTNAME`); with the pod
template's `subdomain` set to the name of a headless Service that selects the job's pods,
it is reachable as `<job>-<k>.<subdomain>`. Kubernetes tells a pod neither the number of
pods nor TensorFlow's cluster, so the manifest adds `STRATEGYKIT_WORKERS` (the Job's
`completions`), and the cluster is built from these: worker k at
`<job>-<k>.<subdomain>:<port>`, worker 0 the chief, the port `STRATEGYKIT_PORT` (default
8888, `port`) in every pod. `examples/kubernetes/indexed-job.yaml` is such a job.

The functions here read the variables both Kubernetes environments share; `jobset.py`
builds on them. The subdomain is `STRATEGYKIT_SERVICE` when set, else the domain of the
pod's fully qualified name (`socket.getfqdn()`: Kubernetes writes
`<hostname>.<subdomain>.<namespace>.svc.<cluster domain>` into the pod's /etc/hosts when
the pod has a subdomain), the one thing not read from the environment.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping, Sequence

from strategykit.cluster.environments.base import Environment, Task
from strategykit.cluster.environments.port import DEFAULT_PORT, read_port

INDEX_VARIABLE = "JOB_COMPLETION_INDEX"
"""Set by Kubernetes in every pod of an Indexed Job: the pod's index in its Job."""

HOSTNAME_VARIABLE = "HOSTNAME"
"""The pod's hostname, `<job>-<index>` in an Indexed Job (set in every container)."""

WORKERS_VARIABLE = "STRATEGYKIT_WORKERS"
"""Set in the manifest: the number of pods that train together (the Job's completions)."""

SERVICE_VARIABLE = "STRATEGYKIT_SERVICE"
"""Optional, set in the manifest: the pods' subdomain (the headless Service's name)."""

JOBSET_PREFIX = "JOBSET_"
"""The prefix of the variables a JobSet's manifest passes down (`jobset.py`)."""


def pod_fqdn() -> str:
    """This pod's fully qualified hostname, where the subdomain is read from.

    Example:
        >>> pod_fqdn()  # in pod 0 of the Indexed Job `train`, subdomain `train`: # doctest: +SKIP
        'train-0.train.default.svc.cluster.local'
    """
    return socket.getfqdn()


def in_jobset(environ: Mapping[str, str]) -> bool:
    """Whether a pod's environment is that of a JobSet's pod (a `JOBSET_*` variable)."""
    return INDEX_VARIABLE in environ and any(key.startswith(JOBSET_PREFIX) for key in environ)


def integer(environ: Mapping[str, str], name: str, fix: str, *, minimum: int = 0) -> int:
    """The variable `name` as an integer of at least `minimum`.

    Raises:
        ValueError: it is unset, not an integer or too small; the message ends in `fix`.
    """
    raw = environ.get(name)
    if raw is None or not raw.strip().isdecimal() or int(raw) < minimum:
        problem = "is not set" if raw is None else f"must be an integer of at least {minimum}"
        raise ValueError(f"{name} {problem} in this Kubernetes pod. Received: {name}={raw!r}. "
                         f"{fix}")
    return int(raw)


def worker_count(environ: Mapping[str, str], count: str) -> int:
    """`STRATEGYKIT_WORKERS`; `count` says what it must equal in the message's fix."""
    return integer(environ, WORKERS_VARIABLE, minimum=1, fix=(
        f"Add env {WORKERS_VARIABLE}: '2' ({count}) to the container; "
        f"'1' for pods that each train alone."))


def check_below(name: str, value: int, bound: int, what: str, received: str, fix: str) -> None:
    """Fails unless `value < bound`; `what` names the bound, `received` its variables."""
    if value >= bound:
        raise ValueError(f"{name} must be less than {what} ({bound}). Received: {name}={value}, "
                         f"{received}. {fix}")


def hostname_prefix(environ: Mapping[str, str], suffix: str, variables: str) -> str:
    """The pod's hostname without `suffix` (the pod's indexes: `-<index>`).

    Raises:
        ValueError: `HOSTNAME` is unset or does not end in `suffix` after a name.
    """
    hostname = environ.get(HOSTNAME_VARIABLE, "")
    if len(hostname) <= len(suffix) or not hostname.endswith(suffix):
        raise ValueError(
            f"{HOSTNAME_VARIABLE} is not the hostname Kubernetes gives this pod: it should "
            f"end in {suffix!r} ({variables}). Received: "
            f"{HOSTNAME_VARIABLE}={hostname or None!r}. Keep the pod's own hostname (no "
            f"spec.hostname, no hostNetwork) and {HOSTNAME_VARIABLE} as Kubernetes sets it.")
    return hostname[:-len(suffix)]


def subdomain(environ: Mapping[str, str]) -> str:
    """The domain the pods are reachable in: `STRATEGYKIT_SERVICE`, else from the FQDN.

    Raises:
        ValueError: neither gives it (the pod has no subdomain).

    Example:
        >>> subdomain({"STRATEGYKIT_SERVICE": "train", "HOSTNAME": "train-0"})
        'train'
    """
    service = environ.get(SERVICE_VARIABLE, "").strip().strip(".")
    if service:
        return service
    hostname, fqdn = environ.get(HOSTNAME_VARIABLE, ""), pod_fqdn()
    if hostname and fqdn.startswith(f"{hostname}.") and len(fqdn) > len(hostname) + 1:
        return fqdn[len(hostname) + 1:].rstrip(".")
    raise ValueError(
        f"The pods' subdomain is unknown: {SERVICE_VARIABLE} is not set and this pod's "
        f"fully qualified name has no domain. Received: {SERVICE_VARIABLE}="
        f"{environ.get(SERVICE_VARIABLE)!r}, FQDN {fqdn!r}. Set the pod template's "
        f"spec.subdomain to the name of a headless Service (clusterIP: None) selecting the "
        f"job's pods, or add env {SERVICE_VARIABLE}: '<that name>' to the container.")


def port(environ: Mapping[str, str]) -> int:
    """`STRATEGYKIT_PORT`, the port every pod listens on; default 8888 (`port.read_port`)."""
    return read_port(environ, fix=f"Use the containerPort of the manifest, e.g. '{DEFAULT_PORT}'.")


def pods_task(environ: Mapping[str, str], rank: int, hostnames: Sequence[str]) -> Task:
    """Worker `rank` of the pods `hostnames`, each at `<hostname>.<subdomain>:<port>`.

    One pod alone trains on its own devices: `Task("worker", 0, {})`, no Service needed.
    """
    if len(hostnames) == 1:
        return Task("worker", 0, {})
    domain, listen = subdomain(environ), port(environ)
    return Task("worker", rank, {"worker": [f"{host}.{domain}:{listen}" for host in hostnames]})


class KubernetesIndexedJob(Environment):
    """The pods of a Kubernetes Indexed Job, pod k worker k (`JOB_COMPLETION_INDEX`).

    Detected in a pod of an Indexed Job that is not a JobSet's (no `JOBSET_*` variable).
    Needs `STRATEGYKIT_WORKERS` (the Job's completions) and the pods' subdomain (see the
    module); `STRATEGYKIT_PORT` optional.

    Example:
        >>> pod = {"JOB_COMPLETION_INDEX": "1", "HOSTNAME": "train-1",
        ...        "STRATEGYKIT_WORKERS": "2", "STRATEGYKIT_SERVICE": "train"}
        >>> environment = KubernetesIndexedJob(pod)
        >>> environment.task().cluster
        {'worker': ['train-0.train:8888', 'train-1.train:8888']}
        >>> environment.describe(), environment.workers(), environment.worker_index()
        ('Kubernetes Indexed Job', 2, 1)
    """

    name = "Kubernetes Indexed Job"

    def detected(self) -> bool:
        return INDEX_VARIABLE in self.environ and not in_jobset(self.environ)

    def task(self) -> Task:
        fix = "Run the pods as an Indexed Job (completionMode: Indexed), which sets it."
        index = integer(self.environ, INDEX_VARIABLE, fix)
        count = worker_count(self.environ, "the Job's completions")
        check_below(INDEX_VARIABLE, index, count, WORKERS_VARIABLE,
                    f"{WORKERS_VARIABLE}={count}",
                    f"Set {WORKERS_VARIABLE} to the Job's completions (and parallelism).")
        job = hostname_prefix(self.environ, f"-{index}", f"-<{INDEX_VARIABLE}>")
        return pods_task(self.environ, index, [f"{job}-{k}" for k in range(count)])
