"""A Kubernetes JobSet (jobset.x-k8s.io/v1alpha2): one worker a pod of its Indexed Jobs.

A JobSet runs `replicas` copies of a replicated job, each an Indexed Job of `parallelism`
pods. Pod p of job j has the hostname `<jobset>-<replicated job>-<j>-<p>` (in
`HOSTNAME`), `JOB_COMPLETION_INDEX=p`, the annotations `jobset.sigs.k8s.io/job-index=j`
and `jobset.sigs.k8s.io/replicatedjob-replicas`, and is reachable as
`<hostname>.<subdomain>` through the headless Service the JobSet creates (its subdomain:
`spec.network.subdomain`, default the JobSet's name). A container sees annotations only
when the manifest passes them down (the downward API), so it adds:

- `JOBSET_JOB_INDEX` from `metadata.annotations['jobset.sigs.k8s.io/job-index']`;
- `JOBSET_REPLICAS` from `metadata.annotations['jobset.sigs.k8s.io/replicatedjob-replicas']`;
- `STRATEGYKIT_WORKERS`: every pod of the job set, `replicas` x `parallelism`.

Worker `j * parallelism + p` is that pod, worker 0 the chief. The subdomain and the port
are read as for an Indexed Job (`kubernetes_job`). The workers are the pods of one
replicated job; `examples/kubernetes/jobset.yaml` is such a JobSet.
"""

from __future__ import annotations

from strategykit.cluster.environments.base import Environment, Task
from strategykit.cluster.environments.kubernetes_job import (
    INDEX_VARIABLE,
    WORKERS_VARIABLE,
    check_below,
    hostname_prefix,
    in_jobset,
    integer,
    pods_task,
    worker_count,
)

JOB_INDEX_VARIABLE = "JOBSET_JOB_INDEX"
"""Set in the manifest from the pod's annotation `jobset.sigs.k8s.io/job-index`."""

REPLICAS_VARIABLE = "JOBSET_REPLICAS"
"""Set in the manifest from the pod's annotation `jobset.sigs.k8s.io/replicatedjob-replicas`."""

_ANNOTATIONS = {
    JOB_INDEX_VARIABLE: "jobset.sigs.k8s.io/job-index",
    REPLICAS_VARIABLE: "jobset.sigs.k8s.io/replicatedjob-replicas",
}


def _passed_down(name: str) -> str:
    """The fix for a missing or malformed annotation variable."""
    return (f"Add env {name} to the container, valueFrom: {{fieldRef: {{fieldPath: "
            f"\"metadata.annotations['{_ANNOTATIONS[name]}']\"}}}}.")


class JobSet(Environment):
    """The pods of one replicated job of a Kubernetes JobSet, job by job.

    Detected in a pod of an Indexed Job with a `JOBSET_*` variable. Needs
    `JOBSET_JOB_INDEX`, `JOBSET_REPLICAS`, `STRATEGYKIT_WORKERS` and the pods' subdomain
    (see the module); `STRATEGYKIT_PORT` optional.

    Example:
        >>> pod = {"JOB_COMPLETION_INDEX": "0", "JOBSET_JOB_INDEX": "1",
        ...        "JOBSET_REPLICAS": "2", "STRATEGYKIT_WORKERS": "4",
        ...        "HOSTNAME": "train-workers-1-0", "STRATEGYKIT_SERVICE": "train"}
        >>> environment = JobSet(pod)
        >>> environment.task().cluster["worker"][2]
        'train-workers-1-0.train:8888'
        >>> environment.describe(), environment.workers(), environment.worker_index()
        ('Kubernetes JobSet', 4, 2)
    """

    name = "Kubernetes JobSet"

    def detected(self) -> bool:
        return in_jobset(self.environ)

    def task(self) -> Task:
        pod = integer(self.environ, INDEX_VARIABLE,
                      "Run the pods in a JobSet, whose Jobs are Indexed and set it.")
        job = integer(self.environ, JOB_INDEX_VARIABLE, _passed_down(JOB_INDEX_VARIABLE))
        replicas = integer(self.environ, REPLICAS_VARIABLE, _passed_down(REPLICAS_VARIABLE),
                           minimum=1)
        count = worker_count(self.environ, "the replicated job's replicas x parallelism")
        if count % replicas:
            raise ValueError(
                f"{WORKERS_VARIABLE} must be a multiple of {REPLICAS_VARIABLE}: every job of "
                f"the set has the same number of pods. Received: {WORKERS_VARIABLE}={count}, "
                f"{REPLICAS_VARIABLE}={replicas}. Set {WORKERS_VARIABLE} to replicas x "
                "parallelism of the replicated job.")
        per_job = count // replicas
        received = f"{WORKERS_VARIABLE}={count}, {REPLICAS_VARIABLE}={replicas}"
        check_below(JOB_INDEX_VARIABLE, job, replicas, REPLICAS_VARIABLE, received,
                    "Pass both down from the pod's annotations (examples/kubernetes/jobset.yaml).")
        check_below(INDEX_VARIABLE, pod, per_job, "the pods of a job", received,
                    f"Set {WORKERS_VARIABLE} to replicas x parallelism of the replicated job.")
        prefix = hostname_prefix(self.environ, f"-{job}-{pod}",
                                 f"-<{JOB_INDEX_VARIABLE}>-<{INDEX_VARIABLE}>")
        hosts = [f"{prefix}-{j}-{p}" for j in range(replicas) for p in range(per_job)]
        return pods_task(self.environ, job * per_job + pod, hosts)
