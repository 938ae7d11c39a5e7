"""The environments a job's workers come from, as `sk.from_env()`, `sk.is_chief()`,
`worker_index()` and `strategykit info` see them: `TF_CONFIG` in the exact shapes
Vertex AI, SageMaker and Azure ML write, SLURM, and the order of detection. (Kubernetes:
test_environments_kubernetes.py; real multi-worker jobs: test_multi_worker.py.)"""

import json

import pytest

import strategykit as sk
from strategykit.cli import commands as cli
from strategykit.cluster import environments, roles

# Vertex AI, 1 chief (workerpool0) and 2 workers (workerpool1), as its docs show TF_CONFIG
# (the `job` field shortened); CLUSTER_SPEC is set beside it.
VERTEX = {
    "cluster": {"chief": ["cmle-training-workerpool0-ab12-0:2222"],
                "worker": ["cmle-training-workerpool1-ab12-0:2222",
                           "cmle-training-workerpool1-ab12-1:2222"]},
    "environment": "cloud",
    "task": {"type": "worker", "index": 0, "trial": ""},
    "job": {"worker_pool_specs": [{"replica_count": 1}, {"replica_count": 2}]},
}
# SageMaker with distribution={"multi_worker_mirrored_strategy": {"enabled": True}}.
SAGEMAKER = {"cluster": {"worker": ["algo-1:8890", "algo-2:8890"]}, "environment": "cloud",
             "task": {"index": 1, "type": "worker"}}
# Azure ML with distribution: {type: tensorflow, worker_count: 2}.
AZURE = {"cluster": {"worker": ["10.0.0.4:2222", "10.0.0.5:2222"]},
         "task": {"type": "worker", "index": 0}, "environment": "cloud"}


def _with(task, config):
    return json.dumps({**config, "task": {**config["task"], **task}})


@pytest.mark.parametrize("task, index, chief", [
    ({"type": "chief", "index": 0}, 0, True),
    ({"type": "worker", "index": 0}, 1, False),
    ({"type": "worker", "index": 1}, 2, False),
])
def test_vertex_ai_chief_and_workers(monkeypatch, task, index, chief):
    monkeypatch.setenv("TF_CONFIG", _with(task, VERTEX))
    monkeypatch.setenv("CLUSTER_SPEC", json.dumps({"cluster": {}}))
    environment = environments.detect()
    assert environment.describe() == "TF_CONFIG (Vertex AI)"
    assert (environment.workers(), environment.worker_index()) == (3, index)
    assert (sk.is_chief(), roles.worker_index()) == (chief, index)
    assert environment.resolver().cluster_spec().as_dict() == VERTEX["cluster"]


@pytest.mark.parametrize("config, marker, writer", [
    (SAGEMAKER, "SM_TRAINING_ENV", "SageMaker"), (AZURE, "AZUREML_RUN_ID", "Azure ML"),
])
def test_sagemaker_and_azure_ml_workers(monkeypatch, config, marker, writer):
    monkeypatch.setenv("TF_CONFIG", json.dumps(config))
    monkeypatch.setenv(marker, "{}")
    environment = environments.detect()
    assert environment.describe() == f"TF_CONFIG ({writer})"
    index = config["task"]["index"]
    assert (environment.workers(), environment.worker_index()) == (2, index)
    assert sk.is_chief() == (index == 0)  # no chief task: worker 0 writes the files


def test_the_evaluator_of_a_cloud_job_is_told_it_trains_nothing(monkeypatch):
    # Vertex AI's evaluator pool: task type "evaluator", which its cluster does not list.
    monkeypatch.setenv("TF_CONFIG", _with({"type": "evaluator", "index": 0}, VERTEX))
    with pytest.raises(ValueError, match=(
            r"TF_CONFIG makes this process the 'evaluator' task, which trains nothing: "
            r"strategykit trains on the chief and the workers of the cluster only\. "
            r"Received: task=\{'type': 'evaluator', 'index': 0, 'trial': ''\}\. Run the job "
            r"without an evaluator \(Vertex AI: no evaluator worker pool\)")):
        sk.from_env()


def test_parameter_servers_are_not_trained_with(monkeypatch):
    config = {"cluster": {"chief": ["c:2222"], "ps": ["p:2222"], "worker": ["w:2222"]},
              "task": {"type": "worker", "index": 0}, "environment": "cloud"}
    monkeypatch.setenv("TF_CONFIG", json.dumps(config))
    with pytest.raises(ValueError, match=(
            r"TF_CONFIG's cluster has task types strategykit does not train with: \['ps'\]\. "
            r"Received: cluster task types \['chief', 'ps', 'worker'\]\. Use only 'chief'")):
        sk.from_env()


SLURM_STEP = {"SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "2",
              "SLURM_STEP_NODELIST": "n[1-2]", "SLURM_STEP_TASKS_PER_NODE": "1(x2)"}


def test_slurm_when_there_is_no_tf_config(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    for name, value in SLURM_STEP.items():
        monkeypatch.setenv(name, value)
    environment = environments.detect()
    assert environment.describe() == "SLURM"
    assert (environment.workers(), environment.worker_index()) == (2, 1)
    assert not sk.is_chief()


def test_tf_config_wins_over_slurm(monkeypatch):
    for name, value in SLURM_STEP.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("TF_CONFIG", json.dumps(AZURE))
    monkeypatch.setenv("STRATEGYKIT_WORKER", "0")
    assert environments.detect().describe() == "TF_CONFIG (strategykit launch)"


def test_one_machine_without_any(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    environment = environments.detect()
    assert (environment.describe(), environment.workers(), environment.worker_index()) == (
        "one machine", 1, 0)


def test_info_names_the_environment(monkeypatch, capsys):
    monkeypatch.setenv("TF_CONFIG", json.dumps(SAGEMAKER))
    monkeypatch.setenv("SM_TRAINING_ENV", "{}")
    assert cli.main(["info", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["environment"] == "TF_CONFIG (SageMaker)"
    monkeypatch.delenv("TF_CONFIG")
    cli.main(["info"])
    assert "Environment        one machine\n" in capsys.readouterr().out
