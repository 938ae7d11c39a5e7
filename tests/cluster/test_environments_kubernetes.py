"""Kubernetes Indexed Jobs and JobSets: each pod's worker, the cluster, the manifests.

No cluster here: a pod's environment is what Kubernetes would give pod k (its index, its
hostname, the manifest's variables, the annotations the downward API passes down), and
its fully qualified name is what Kubernetes writes into the pod's /etc/hosts. The
manifests in examples/kubernetes/ are read and played the same way, with Kubernetes's
DNS rules for headless Services, so that code and manifests cannot drift apart.
"""

import copy
import pathlib
import re

import pytest
import yaml

from strategykit.cluster import environments
from strategykit.cluster.environments import (
    JobSet,
    KubernetesIndexedJob,
    OneMachine,
    Task,
    jobset,
    kubernetes_job,
)
from strategykit.cluster.environments.slurm import Slurm
from strategykit.cluster.environments.tf_config import TFConfig

EXAMPLES = pathlib.Path(__file__).parents[2] / "examples" / "kubernetes"
CLUSTER_DOMAIN = "cluster.local"


@pytest.fixture(autouse=True)
def pod_fqdn(monkeypatch):
    """`pod_fqdn.value = name` sets the pod's FQDN; by default one without a domain."""

    class Fqdn:
        value = "not-a-pod"

    monkeypatch.setattr(kubernetes_job, "pod_fqdn", lambda: Fqdn.value)
    for name in ("SLURM_PROCID", "SLURM_STEP_NUM_TASKS"):  # Slurm reads os.environ
        monkeypatch.delenv(name, raising=False)
    return Fqdn


def indexed_pod(index, workers, job="train", **extra):
    """The environment of pod `index` of the Indexed Job `job` of `workers` pods."""
    env = {"JOB_COMPLETION_INDEX": str(index), "HOSTNAME": f"{job}-{index}",
           "STRATEGYKIT_WORKERS": str(workers), "STRATEGYKIT_SERVICE": job}
    env.update(extra)
    return {name: value for name, value in env.items() if value is not None}


def jobset_pod(job, pod, replicas, per_job, name="js-workers", **extra):
    """The environment of pod `pod` of job `job` of a JobSet's replicated job `name`."""
    env = {"JOB_COMPLETION_INDEX": str(pod), "HOSTNAME": f"{name}-{job}-{pod}",
           "JOBSET_JOB_INDEX": str(job), "JOBSET_REPLICAS": str(replicas),
           "STRATEGYKIT_WORKERS": str(replicas * per_job), "STRATEGYKIT_SERVICE": "js"}
    env.update(extra)
    return {name: value for name, value in env.items() if value is not None}


# --- an Indexed Job ------------------------------------------------------------------


@pytest.mark.parametrize("workers", [2, 3])
def test_each_pod_of_an_indexed_job_is_the_worker_of_its_index(workers):
    addresses = [f"train-{k}.train:8888" for k in range(workers)]
    for k in range(workers):
        environment = KubernetesIndexedJob(indexed_pod(k, workers))
        assert environment.detected()
        assert environment.task() == Task("worker", k, {"worker": addresses})
        assert environment.workers() == workers
        assert environment.worker_index() == k
        assert environment.describe() == "Kubernetes Indexed Job"
        resolver = environment.resolver()
        assert resolver.cluster_spec().as_dict() == {"worker": addresses}
        assert (resolver.task_type, resolver.task_id) == ("worker", k)


def test_the_subdomain_comes_from_the_pods_fully_qualified_name(pod_fqdn):
    pod_fqdn.value = "train-1.train-svc.team.svc.cluster.local"
    environment = KubernetesIndexedJob(indexed_pod(1, 2, STRATEGYKIT_SERVICE=None))
    assert environment.task().cluster == {"worker": [
        "train-0.train-svc.team.svc.cluster.local:8888",
        "train-1.train-svc.team.svc.cluster.local:8888"]}


def test_strategykit_service_wins_over_the_fully_qualified_name(pod_fqdn):
    pod_fqdn.value = "train-1.other.team.svc.cluster.local"
    assert KubernetesIndexedJob(indexed_pod(1, 2)).task().cluster["worker"][0] == \
        "train-0.train:8888"


def test_strategykit_port_sets_every_workers_port():
    environment = KubernetesIndexedJob(indexed_pod(0, 2, STRATEGYKIT_PORT="23456"))
    assert environment.task().cluster == {"worker": ["train-0.train:23456",
                                                     "train-1.train:23456"]}


def test_a_job_of_one_pod_trains_alone_without_a_service():
    environment = KubernetesIndexedJob(indexed_pod(0, 1, STRATEGYKIT_SERVICE=None))
    assert environment.task() == Task("worker", 0, {})
    assert (environment.workers(), environment.worker_index()) == (1, 0)


WORKERS_FIX = re.escape("Add env STRATEGYKIT_WORKERS: '2' (the Job's completions) to the container")


@pytest.mark.parametrize("env, message", [
    (indexed_pod(0, 2, STRATEGYKIT_WORKERS=None),
     r"STRATEGYKIT_WORKERS is not set in this Kubernetes pod\. Received: "
     rf"STRATEGYKIT_WORKERS=None\. {WORKERS_FIX}; '1' for pods that each train alone\."),
    (indexed_pod(0, 2, STRATEGYKIT_WORKERS="two"),
     r"STRATEGYKIT_WORKERS must be an integer of at least 1 in this Kubernetes pod\. "
     rf"Received: STRATEGYKIT_WORKERS='two'\. {WORKERS_FIX}"),
    (indexed_pod(0, 2, STRATEGYKIT_WORKERS="0"),
     r"at least 1 in this Kubernetes pod\. Received: STRATEGYKIT_WORKERS='0'\."),
    (indexed_pod(2, 2),
     r"JOB_COMPLETION_INDEX must be less than STRATEGYKIT_WORKERS \(2\)\. Received: "
     r"JOB_COMPLETION_INDEX=2, STRATEGYKIT_WORKERS=2\. Set STRATEGYKIT_WORKERS to the "
     r"Job's completions \(and parallelism\)\."),
    (indexed_pod(0, 2, JOB_COMPLETION_INDEX="-1"),
     r"JOB_COMPLETION_INDEX must be an integer of at least 0 in this Kubernetes pod\. "
     r"Received: JOB_COMPLETION_INDEX='-1'\. Run the pods as an Indexed Job "
     r"\(completionMode: Indexed\), which sets it\."),
    (indexed_pod(1, 2, HOSTNAME="train-7"),
     r"HOSTNAME is not the hostname Kubernetes gives this pod: it should end in '-1' "
     r"\(-<JOB_COMPLETION_INDEX>\)\. Received: HOSTNAME='train-7'\. Keep the pod's own "
     r"hostname \(no spec\.hostname, no hostNetwork\) and HOSTNAME as Kubernetes sets it\."),
    (indexed_pod(1, 2, HOSTNAME="-1"), r"Received: HOSTNAME='-1'\."),
    (indexed_pod(1, 2, HOSTNAME=None), r"Received: HOSTNAME=None\."),
    (indexed_pod(0, 2, STRATEGYKIT_SERVICE=None),
     r"The pods' subdomain is unknown: STRATEGYKIT_SERVICE is not set and this pod's fully "
     r"qualified name has no domain\. Received: STRATEGYKIT_SERVICE=None, FQDN 'not-a-pod'\. "
     r"Set the pod template's spec\.subdomain to the name of a headless Service "
     r"\(clusterIP: None\) selecting the job's pods, or add env STRATEGYKIT_SERVICE: "
     r"'<that name>' to the container\."),
    (indexed_pod(0, 2, STRATEGYKIT_PORT="http"),
     r"STRATEGYKIT_PORT must be an integer from 1 to 65535\. Received: STRATEGYKIT_PORT='http'\. "
     r"Use the containerPort of the manifest, e.g\. '8888'\."),
    (indexed_pod(0, 2, STRATEGYKIT_PORT="70000"), r"Received: STRATEGYKIT_PORT='70000'\."),
], ids=["no-workers", "workers-not-a-number", "no-worker", "index-too-high",
        "index-negative", "hostname-of-another-index", "hostname-without-name",
        "no-hostname", "no-subdomain", "port-not-a-number", "port-too-high"])
def test_a_malformed_indexed_job_pod_is_told_what_to_fix(env, message):
    environment = KubernetesIndexedJob(env)
    assert environment.detected()
    with pytest.raises(ValueError, match=message):
        environment.task()


def test_a_pod_whose_fqdn_is_another_hosts_has_no_subdomain(pod_fqdn):
    pod_fqdn.value = "train-10.train.default.svc.cluster.local"  # not train-1's
    with pytest.raises(ValueError, match=r"FQDN 'train-10\.train\.default\.svc\."):
        KubernetesIndexedJob(indexed_pod(1, 2, STRATEGYKIT_SERVICE=None)).task()


# --- a JobSet ------------------------------------------------------------------------


@pytest.mark.parametrize("replicas, per_job", [(2, 1), (1, 3), (2, 2)])
def test_each_pod_of_a_jobset_is_the_worker_of_its_job_and_index(replicas, per_job):
    addresses = [f"js-workers-{j}-{p}.js:8888" for j in range(replicas) for p in range(per_job)]
    for rank, (j, p) in enumerate((j, p) for j in range(replicas) for p in range(per_job)):
        environment = JobSet(jobset_pod(j, p, replicas, per_job))
        assert environment.detected()
        assert environment.task() == Task("worker", rank, {"worker": addresses})
        assert environment.workers() == replicas * per_job
        assert environment.worker_index() == rank
        assert environment.describe() == "Kubernetes JobSet"
        resolver = environment.resolver()
        assert resolver.cluster_spec().as_dict() == {"worker": addresses}
        assert resolver.task_id == rank


def test_a_jobset_pod_reads_its_subdomain_from_its_fqdn(pod_fqdn):
    pod_fqdn.value = "js-workers-0-1.js.default.svc.cluster.local"
    environment = JobSet(jobset_pod(0, 1, 1, 2, STRATEGYKIT_SERVICE=None))
    assert environment.task() == Task("worker", 1, {"worker": [
        "js-workers-0-0.js.default.svc.cluster.local:8888",
        "js-workers-0-1.js.default.svc.cluster.local:8888"]})


ANNOTATION_FIX = ("Add env {0} to the container, valueFrom: {{fieldRef: {{fieldPath: "
                  "\"metadata.annotations['jobset.sigs.k8s.io/{1}']\"}}}}.")


@pytest.mark.parametrize("env, message", [
    (jobset_pod(0, 0, 2, 1, JOBSET_JOB_INDEX=None),
     "JOBSET_JOB_INDEX is not set in this Kubernetes pod. Received: JOBSET_JOB_INDEX=None. "
     + ANNOTATION_FIX.format("JOBSET_JOB_INDEX", "job-index")),
    (jobset_pod(0, 0, 2, 1, JOBSET_REPLICAS=None),
     "JOBSET_REPLICAS is not set in this Kubernetes pod. Received: JOBSET_REPLICAS=None. "
     + ANNOTATION_FIX.format("JOBSET_REPLICAS", "replicatedjob-replicas")),
    (jobset_pod(0, 0, 2, 1, JOBSET_REPLICAS="0"),
     "JOBSET_REPLICAS must be an integer of at least 1 in this Kubernetes pod. Received: "
     "JOBSET_REPLICAS='0'."),
    (jobset_pod(0, 0, 2, 1, STRATEGYKIT_WORKERS=None),
     "STRATEGYKIT_WORKERS is not set in this Kubernetes pod. Received: "
     "STRATEGYKIT_WORKERS=None. Add env STRATEGYKIT_WORKERS: '2' (the replicated job's "
     "replicas x parallelism) to the container; '1' for pods that each train alone."),
    (jobset_pod(0, 0, 2, 1, STRATEGYKIT_WORKERS="3"),
     "STRATEGYKIT_WORKERS must be a multiple of JOBSET_REPLICAS: every job of the set has the "
     "same number of pods. Received: STRATEGYKIT_WORKERS=3, JOBSET_REPLICAS=2. Set "
     "STRATEGYKIT_WORKERS to replicas x parallelism of the replicated job."),
    (jobset_pod(2, 0, 2, 1),
     "JOBSET_JOB_INDEX must be less than JOBSET_REPLICAS (2). Received: JOBSET_JOB_INDEX=2, "
     "STRATEGYKIT_WORKERS=2, JOBSET_REPLICAS=2. Pass both down from the pod's annotations "
     "(examples/kubernetes/jobset.yaml)."),
    (jobset_pod(0, 1, 2, 1),
     "JOB_COMPLETION_INDEX must be less than the pods of a job (1). Received: "
     "JOB_COMPLETION_INDEX=1, STRATEGYKIT_WORKERS=2, JOBSET_REPLICAS=2. Set "
     "STRATEGYKIT_WORKERS to replicas x parallelism of the replicated job."),
    (jobset_pod(1, 0, 2, 1, HOSTNAME="js-workers-0-1"),
     "HOSTNAME is not the hostname Kubernetes gives this pod: it should end in '-1-0' "
     "(-<JOBSET_JOB_INDEX>-<JOB_COMPLETION_INDEX>). Received: HOSTNAME='js-workers-0-1'."),
], ids=["no-job-index", "no-replicas", "zero-replicas", "no-workers", "uneven-workers",
        "job-index-too-high", "pod-index-too-high", "hostname-of-another-pod"])
def test_a_malformed_jobset_pod_is_told_what_to_fix(env, message):
    environment = JobSet(env)
    assert environment.detected()
    with pytest.raises(ValueError, match=f"^{re.escape(message)}"):
        environment.task()


# --- detection -----------------------------------------------------------------------


def test_jobset_then_indexed_job_are_tried_after_slurm():
    assert environments.ENVIRONMENTS == (TFConfig, Slurm, JobSet, KubernetesIndexedJob)


@pytest.mark.parametrize("env, kind", [
    ({}, OneMachine),
    ({"STRATEGYKIT_WORKERS": "2", "HOSTNAME": "train-0"}, OneMachine),  # not a Job's pod
    (indexed_pod(0, 2), KubernetesIndexedJob),
    (jobset_pod(0, 0, 2, 1), JobSet),
    (jobset_pod(0, 0, 2, 1, JOBSET_JOB_INDEX=None), JobSet),  # told to pass it down
    (indexed_pod(0, 2, TF_CONFIG='{"cluster": {"worker": ["a:1", "b:1"]}, '
                 '"task": {"type": "worker", "index": 0}}'), TFConfig),
    (jobset_pod(0, 0, 2, 1, TF_CONFIG='{"cluster": {"worker": ["a:1", "b:1"]}, '
                '"task": {"type": "worker", "index": 0}}'), TFConfig),
], ids=["nothing", "no-index", "indexed-job", "jobset", "jobset-without-job-index",
        "tf-config-over-job", "tf-config-over-jobset"])
def test_detect_finds_the_environment_of_the_pod(env, kind):
    assert type(environments.detect(env)) is kind


def test_a_jobset_pod_is_not_taken_for_a_plain_indexed_job():
    assert not KubernetesIndexedJob(jobset_pod(0, 0, 2, 1)).detected()
    assert not JobSet(indexed_pod(0, 2)).detected()


# --- the manifests, played as Kubernetes would -----------------------------------------


def manifest(name):
    """The documents of examples/kubernetes/`name`, by kind."""
    documents = list(yaml.safe_load_all((EXAMPLES / name).read_text()))
    kinds = [document["kind"] for document in documents]
    assert len(kinds) == len(set(kinds)), kinds
    return {document["kind"]: document for document in documents}


def container(pod_template):
    (only,) = pod_template["spec"]["containers"]
    return only


def downward(field_path, pod):
    """What the downward API gives for `metadata.labels['k']` or `.annotations['k']`."""
    match = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", field_path)
    assert match, f"no such downward API field here: {field_path!r}"
    return pod[match[1]][match[2]]


def pod_environ(pod_template, pod):
    """The container's environment in `pod`: the manifest's `env` and Kubernetes's own."""
    environ = {"JOB_COMPLETION_INDEX": pod["annotations"][
        "batch.kubernetes.io/job-completion-index"], "HOSTNAME": pod["hostname"]}
    for variable in container(pod_template).get("env", []):
        if "value" in variable:
            environ[variable["name"]] = variable["value"]
        else:
            environ[variable["name"]] = downward(
                variable["valueFrom"]["fieldRef"]["fieldPath"], pod)
    return environ


def job_pods(job_name, job_spec, labels=(), annotations=()):
    """The pods the Job controller creates for an Indexed Job (Kubernetes 1.27+)."""
    template = job_spec["template"]
    pods = []
    for index in range(job_spec["completions"]):
        pod = {
            "hostname": f"{job_name}-{index}",
            "subdomain": template["spec"].get("subdomain"),
            "labels": {**template.get("metadata", {}).get("labels", {}), **dict(labels),
                       "batch.kubernetes.io/job-name": job_name, "job-name": job_name,
                       "batch.kubernetes.io/job-completion-index": str(index)},
            "annotations": {**template.get("metadata", {}).get("annotations", {}),
                            **dict(annotations),
                            "batch.kubernetes.io/job-completion-index": str(index)},
        }
        pod["environ"] = pod_environ(template, pod)
        pods.append(pod)
    return pods


def jobset_pods(document):
    """The pods the JobSet controller creates: its Jobs' pods, labelled and annotated."""
    name = document["metadata"]["name"]
    (replicated,) = document["spec"]["replicatedJobs"]
    pods = []
    for job in range(replicated.get("replicas", 1)):
        marks = {"jobset.sigs.k8s.io/jobset-name": name,
                 "jobset.sigs.k8s.io/replicatedjob-name": replicated["name"],
                 "jobset.sigs.k8s.io/replicatedjob-replicas": str(replicated.get("replicas", 1)),
                 "jobset.sigs.k8s.io/job-index": str(job)}
        spec = copy.deepcopy(replicated["template"]["spec"])
        spec["template"]["spec"]["subdomain"] = document["spec"].get(
            "network", {}).get("subdomain", name)
        pods += job_pods(f"{name}-{replicated['name']}-{job}", spec, marks, marks)
    return pods


def selects(selector, labels):
    return all(labels.get(key) == value for key, value in selector.items())


def dns(services, pods, namespace="default"):
    """name -> pod: the records of headless Services, `<hostname>.<service>.<ns>.svc...`."""
    records = {}
    for service in services:
        assert service["spec"]["clusterIP"] == "None"
        for pod in pods:
            if selects(service["spec"]["selector"], pod["labels"]) and \
                    pod["subdomain"] == service["metadata"]["name"]:
                name = f"{pod['hostname']}.{pod['subdomain']}.{namespace}.svc.{CLUSTER_DOMAIN}"
                records[name] = pod
    return records


def resolve(name, records, namespace="default"):
    """The pod a name resolves to from a pod in `namespace` (its resolv.conf search list)."""
    searches = [f"{namespace}.svc.{CLUSTER_DOMAIN}", f"svc.{CLUSTER_DOMAIN}", CLUSTER_DOMAIN]
    for candidate in [name] + [f"{name}.{search}" for search in searches]:
        if candidate in records:
            return records[candidate]
    raise AssertionError(f"{name!r} resolves to no pod; records: {sorted(records)}")


def play(pods, services, kind, pod_fqdn, namespace="default"):
    """Runs each pod's environment as the pod would; checks rank k's address is pod k's."""
    records = dns(services, pods, namespace)
    clusters = []
    for rank, pod in enumerate(pods):
        pod_fqdn.value = f"{pod['hostname']}.{pod['subdomain']}.{namespace}.svc.{CLUSTER_DOMAIN}"
        environment = environments.detect(pod["environ"])
        assert type(environment) is kind
        task = environment.task()
        assert (task.type, task.index, environment.workers()) == ("worker", rank, len(pods))
        for peer, address in enumerate(task.cluster["worker"]):
            host, port = address.rsplit(":", 1)
            assert resolve(host, records, namespace) is pods[peer], (address, peer)
            assert int(port) == kubernetes_job.port(pod["environ"])
        clusters.append(task.cluster)
    assert all(cluster == clusters[0] for cluster in clusters)
    return clusters[0]


def check_network_policy(policy, pods, port):
    """Ingress to every pod of the job, only from the job's pods, only on `port`."""
    spec = policy["spec"]
    assert spec["policyTypes"] == ["Ingress"]
    assert all(selects(spec["podSelector"]["matchLabels"], pod["labels"]) for pod in pods)
    (rule,) = spec["ingress"]
    (source,) = rule["from"]
    assert set(source) == {"podSelector"}  # no namespaceSelector, no ipBlock
    assert all(selects(source["podSelector"]["matchLabels"], pod["labels"]) for pod in pods)
    assert not selects(source["podSelector"]["matchLabels"], {"app": "other"})
    assert rule["ports"] == [{"protocol": "TCP", "port": port}]


def test_the_indexed_job_manifest_gives_each_pod_its_worker(pod_fqdn):
    documents = manifest("indexed-job.yaml")
    job, service = documents["Job"], documents["Service"]
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == spec["parallelism"] == 2
    assert spec["template"]["spec"]["subdomain"] == service["metadata"]["name"]
    assert spec["template"]["spec"]["restartPolicy"] == "Never"
    assert spec["backoffLimit"] >= spec["completions"]  # one failure fails every worker
    worker = container(spec["template"])
    assert worker["command"] == ["python", "examples/train_multi_worker.py"]
    env = {variable["name"]: variable.get("value") for variable in worker["env"]}
    assert env[kubernetes_job.WORKERS_VARIABLE] == str(spec["completions"])

    pods = job_pods(job["metadata"]["name"], spec)
    cluster = play(pods, [service], KubernetesIndexedJob, pod_fqdn)
    assert cluster == {"worker": [f"digits-job-{k}.digits-job.default.svc.cluster.local:8888"
                                  for k in range(2)]}
    port = kubernetes_job.port(pods[0]["environ"])
    assert [p["containerPort"] for p in worker["ports"]] == [port]
    assert [p["port"] for p in service["spec"]["ports"]] == [port]
    check_network_policy(documents["NetworkPolicy"], pods, port)


def test_indexed_job_pods_without_the_service_are_told_to_add_it(pod_fqdn):
    spec = manifest("indexed-job.yaml")["Job"]["spec"]
    del spec["template"]["spec"]["subdomain"]
    pod = job_pods("digits-job", spec)[0]
    pod_fqdn.value = pod["hostname"]  # /etc/hosts of a pod without a subdomain
    with pytest.raises(ValueError, match="The pods' subdomain is unknown"):
        environments.detect(pod["environ"]).task()


@pytest.mark.parametrize("replicas, parallelism", [(None, None), (1, 3), (2, 2)],
                         ids=["as-is", "1x3", "2x2"])
def test_the_jobset_manifest_gives_each_pod_its_worker(pod_fqdn, replicas, parallelism):
    documents = manifest("jobset.yaml")
    document = documents["JobSet"]
    (replicated,) = document["spec"]["replicatedJobs"]
    spec = replicated["template"]["spec"]
    worker = container(spec["template"])
    env = {variable["name"]: variable for variable in worker["env"]}
    if replicas is not None:  # the same manifest scaled as its comments say
        replicated["replicas"] = replicas
        spec["completions"] = spec["parallelism"] = parallelism
        env[kubernetes_job.WORKERS_VARIABLE]["value"] = str(replicas * parallelism)
    assert document["spec"]["network"]["enableDNSHostnames"] is True
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == spec["parallelism"]
    assert spec["template"]["spec"]["restartPolicy"] == "Never"
    assert document["spec"]["failurePolicy"]["maxRestarts"] >= 1
    assert env[kubernetes_job.WORKERS_VARIABLE]["value"] == \
        str(replicated["replicas"] * spec["parallelism"])
    for name in (jobset.JOB_INDEX_VARIABLE, jobset.REPLICAS_VARIABLE):
        assert "fieldRef" in env[name]["valueFrom"], name

    pods = jobset_pods(document)
    assert len(pods) == replicated["replicas"] * spec["parallelism"]
    service = {"metadata": {"name": document["spec"]["network"]["subdomain"]},  # the JobSet's
               "spec": {"clusterIP": "None", "selector": {  # own, as its controller makes it
                   "jobset.sigs.k8s.io/jobset-name": document["metadata"]["name"]}}}
    cluster = play(pods, [service], JobSet, pod_fqdn)
    assert cluster["worker"][-1] == (
        f"digits-jobset-workers-{replicated['replicas'] - 1}-{spec['parallelism'] - 1}"
        ".digits-jobset.default.svc.cluster.local:8888")
    port = kubernetes_job.port(pods[0]["environ"])
    assert [p["containerPort"] for p in worker["ports"]] == [port]
    check_network_policy(documents["NetworkPolicy"], pods, port)


def test_jobset_pods_that_misname_an_annotation_are_caught(pod_fqdn):
    document = manifest("jobset.yaml")["JobSet"]
    worker = container(document["spec"]["replicatedJobs"][0]["template"]["spec"]["template"])
    for variable in worker["env"]:
        if variable["name"] == jobset.REPLICAS_VARIABLE:
            variable["valueFrom"]["fieldRef"]["fieldPath"] = \
                "metadata.annotations['jobset.sigs.k8s.io/job-index']"  # 0 and 1: wrong
    pods = jobset_pods(document)
    pod_fqdn.value = f"{pods[0]['hostname']}.digits-jobset.default.svc.cluster.local"
    with pytest.raises(ValueError, match="JOBSET_REPLICAS must be an integer of at least 1"):
        environments.detect(pods[0]["environ"]).task()
