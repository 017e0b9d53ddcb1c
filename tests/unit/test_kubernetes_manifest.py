"""launcher=kubernetes, its pure parts: the manifests checked against the Kubeflow CRDs' published schemas (trimmed,
tests/support/kubeflow_crds.yaml) and for every field the operators need; a pod's rendezvous from the operator's
environment, and its refusals; the pods' command line; a stopped agent at the exit barrier. No process is started."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from test_plan import cfg

from ddp_runner.config.plan import make_plan
from ddp_runner.contract.errors import PlanError
from ddp_runner.launch import kube_manifest as km
from ddp_runner.launch import kubernetes, multinode
from ddp_runner.supervise import exit_barrier

jsonschema = pytest.importorskip("jsonschema", reason="jsonschema validates the manifests (mlflow installs it)")

SCHEMAS = yaml.safe_load((Path(__file__).parents[1] / "support" / "kubeflow_crds.yaml").read_text())
K8S = {"name": "kubernetes", "role": "manifest", "job_name": "exp42", "image": "registry.example/ddp:1", "nodes": 2,
       "nnodes": 2, "nproc_per_node": None, "gpus_per_node": None, "cpu_per_node": None, "memory_per_node": None,
       "namespace": None, "volume": "runs-pvc", "secret": None, "service_account": None, "env": None,
       "termination_grace_s": 60, "restart_policy": "OnFailure", "backoff_limit": 3, "manifest_dir": "kubernetes",
       "local_addr": None, "join_timeout_s": 600, "max_restarts": 0}
ARGS = ["task=gpt", "world_size=16", "launcher=kubernetes", "launcher.nodes=2", "launcher.job_name=exp42",
        "checkpoint.stop_signal=SIGTERM", "launcher.role=pod"]
# What the operators set on a pod (Trainer v2's torch plugin; v1 sets PET_* the same, plus MASTER_*, WORLD_SIZE, RANK).
POD_ENV = {"PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_NPROC_PER_NODE": "8",
           "PET_MASTER_ADDR": "exp42-node-0-0.exp42", "PET_MASTER_PORT": "29500", "POD_IP": "10.0.3.7"}


@pytest.fixture(autouse=True)
def _no_command_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """No ddp-run command line here (an earlier test's Hydra run in this process is not this one's)."""
    monkeypatch.setattr(kubernetes, "_hydra_overrides", lambda: ([], False))


def spec(**over: Any) -> km.PodSpec:
    fields = {"name": "exp42", "image": "registry.example/ddp:1", "args": ARGS, "nodes": 2, "nproc_per_node": 8,
              "gpus_per_node": 8, "cpu_per_node": "32", "memory_per_node": "256Gi", "namespace": "ml",
              "env": {"NCCL_DEBUG": "INFO"}, "secret": "s3-creds", "service_account": "trainer",
              "volume": "runs-pvc", "mount_path": "/runs", "grace_s": 60, "backoff_limit": 3}
    return km.PodSpec(**{**fields, **over})


def valid(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` after checking it against its kind's published schema (every error listed)."""
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
              for e in jsonschema.Draft7Validator(SCHEMAS[obj["kind"]]).iter_errors(obj)]
    assert not errors, errors
    return obj


def test_the_schemas_catch_what_kubernetes_would_drop_or_refuse():
    job = km.train_job(spec())
    for broken in ({**job, "apiVersion": "trainer.kubeflow.org/v1"},
                   {**job, "spec": {**job["spec"], "trainer": {**job["spec"]["trainer"], "numNode": 2}}},
                   {**job, "spec": {**job["spec"], "trainer": {**job["spec"]["trainer"], "numProcPerNode": "8"}}},
                   {**job, "spec": {"trainer": job["spec"]["trainer"]}}):
        assert list(jsonschema.Draft7Validator(SCHEMAS["TrainJob"]).iter_errors(broken)), broken


def test_trainjob_and_its_runtime_have_every_field_the_trainer_operator_needs():
    s = spec()
    runtime, job = valid(km.training_runtime(s)), valid(km.train_job(s))
    # The TrainJob refers to the runtime written beside it, in the same namespace.
    assert job["metadata"] == {**runtime["metadata"], "labels": job["metadata"]["labels"]}
    assert job["spec"]["runtimeRef"] == {"name": "exp42", "apiGroup": "trainer.kubeflow.org", "kind": "TrainingRuntime"}
    assert runtime["metadata"]["name"] == "exp42" and runtime["metadata"]["namespace"] == "ml"
    trainer = job["spec"]["trainer"]
    assert trainer["image"] == "registry.example/ddp:1"
    assert trainer["command"] == ["ddp-run"] and trainer["args"] == ARGS
    assert trainer["numNodes"] == 2 and trainer["numProcPerNode"] == 8  # PET_NNODES, PET_NPROC_PER_NODE
    assert trainer["resourcesPerNode"] == {"limits": {"nvidia.com/gpu": 8, "cpu": "32", "memory": "256Gi"},
                                           "requests": {"cpu": "32", "memory": "256Gi"}}
    assert {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}} in trainer["env"]
    assert {"name": "NCCL_DEBUG", "value": "INFO"} in trainer["env"]
    assert not any(e["name"].startswith("PET_") for e in trainer["env"]), "the torch plugin refuses reserved PET_*"
    # The torch plugin acts on a runtime with mlPolicy.torch, on the replicated job "node" whose Job template
    # carries the trainer ancestor label, and injects PET_* into its container named "node".
    policy = runtime["spec"]["mlPolicy"]
    assert "torch" in policy and policy["numNodes"] == 2
    [node] = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    assert node["name"] == "node" and node["template"]["metadata"]["labels"] == {
        "trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}
    assert node["template"]["spec"]["backoffLimit"] == 3
    # A saved stop (exit 143) or a disruption is replaced without counting toward backoffLimit; needs Never.
    assert node["template"]["spec"]["podFailurePolicy"] == {"rules": [
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
        {"action": "Ignore", "onExitCodes": {"containerName": "node", "operator": "In", "values": [143]}}]}
    pod = node["template"]["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert container["name"] == "node" and container["image"] == "registry.example/ddp:1"
    # A preempted pod gets SIGTERM and this long to save before SIGKILL; a failed one is restarted.
    assert pod["terminationGracePeriodSeconds"] == 60 and pod["restartPolicy"] == "Never"
    assert pod["serviceAccountName"] == "trainer"
    assert pod["volumes"] == [{"name": "runs", "persistentVolumeClaim": {"claimName": "runs-pvc"}}]
    assert container["volumeMounts"] == [{"name": "runs", "mountPath": "/runs"}]
    assert container["envFrom"] == [{"secretRef": {"name": "s3-creds"}}]
    assert runtime["spec"]["template"]["spec"]["failurePolicy"] == {"maxRestarts": 3}


def test_pytorchjob_has_every_field_the_training_operator_needs():
    job = valid(km.pytorch_job(spec(nodes=3)))
    assert job["apiVersion"] == "kubeflow.org/v1" and job["metadata"]["name"] == "exp42"
    assert job["spec"]["nprocPerNode"] == "8"  # a string in v1: PET_NPROC_PER_NODE
    assert job["spec"]["runPolicy"] == {"backoffLimit": 3}
    assert "elasticPolicy" not in job["spec"], "a fixed node count: the Master's service is the rendezvous"
    replicas = job["spec"]["pytorchReplicaSpecs"]
    assert {k: r["replicas"] for k, r in replicas.items()} == {"Master": 1, "Worker": 2}  # node 0, nodes 1 and 2
    for replica in replicas.values():
        assert replica["restartPolicy"] == "ExitCode"  # >= 128 recreated, < 128 fails the job
        pod = replica["template"]["spec"]
        assert pod["terminationGracePeriodSeconds"] == 60 and pod["serviceAccountName"] == "trainer"
        [container] = pod["containers"]
        # The operator reads the master's port from container "pytorch", port "pytorchjob-port" (PET_MASTER_PORT).
        assert container["name"] == "pytorch" and container["ports"] == [{"name": "pytorchjob-port",
                                                                         "containerPort": 29500}]
        assert container["command"] == ["ddp-run"] and container["args"] == ARGS
        assert container["resources"]["limits"]["nvidia.com/gpu"] == 8
        assert container["envFrom"] == [{"secretRef": {"name": "s3-creds"}}]
        assert container["volumeMounts"] == [{"name": "runs", "mountPath": "/runs"}]
    assert list(valid(km.pytorch_job(spec(nodes=1)))["spec"]["pytorchReplicaSpecs"]) == ["Master"]


def test_the_smallest_manifests_are_valid_too():
    bare = spec(gpus_per_node=0, cpu_per_node=None, memory_per_node=None, namespace=None, env={}, secret=None,
                service_account=None, volume=None, mount_path=None)
    runtime, job, v1 = valid(km.training_runtime(bare)), valid(km.train_job(bare)), valid(km.pytorch_job(bare))
    assert "resourcesPerNode" not in job["spec"]["trainer"] and "namespace" not in job["metadata"]
    pod = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert "volumes" not in pod and set(pod["containers"][0]) == {"name", "image"}
    assert "resources" not in v1["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]


def test_pod_spec_from_the_plan_and_the_command_line():
    plan = make_plan(cfg(world_size=16, device="auto", launcher={"name": "kubernetes", "nnodes": 2}), [])
    conf = {"launcher": {**K8S}, "output": {"root": "/runs"}}
    s = kubernetes.pod_spec(conf, plan, ARGS, None)
    assert (s.nodes, s.nproc_per_node, s.gpus_per_node) == (2, 8, 8), "one GPU per rank unless told"
    assert (s.volume, s.mount_path, s.grace_s) == ("runs-pvc", "/runs", 60)
    assert kubernetes.pod_spec(conf, plan, ARGS, "cpu").gpus_per_node == 0
    assert kubernetes.pod_spec({**conf, "launcher": {**K8S, "gpus_per_node": 4}}, plan, ARGS, None).gpus_per_node == 4
    s3 = kubernetes.pod_spec({"launcher": {**K8S, "volume": None}, "output": {"root": "s3://b/runs"}}, plan, ARGS, None)
    assert s3.volume is None and s3.mount_path is None


def test_pod_args_are_the_command_line_as_a_pod_of_the_job():
    given = ["task=gpt", "launcher=kubernetes", "launcher.job_name=exp42", "dry_run=true",
             "launcher.manifest_dir=/tmp/k", "+launcher.env.X=$(HOME)", "data.path=$(HOME)/d",
             "launcher.env={HF_TOKEN:${oc.env:MYTOK}}"]
    # launcher.env reaches the pods as their environment, never as an argument (a secret would be in plain text).
    assert kubernetes.pod_args(given) == ["task=gpt", "launcher=kubernetes", "launcher.job_name=exp42",
                                          "data.path=$$(HOME)/d", "checkpoint.stop_signal=SIGTERM",
                                          "launcher.role=pod"]
    assert "checkpoint.stop_signal=SIGTERM" not in kubernetes.pod_args(["checkpoint.stop_signal=SIGUSR2"])
    with pytest.raises(PlanError) as e:
        kubernetes.pod_args(["output.root=s3://AKIA:secret@bucket/runs"])
    assert e.value.key == "output.root" and "secret" not in str(e.value.value) and "launcher.secret" in e.value.fix
    with pytest.raises(PlanError) as e:  # credentials in a query string, refused the same
        kubernetes.pod_args(["output.root=s3://bucket/p?aws_secret_access_key=topsecret"])
    assert e.value.key == "output.root" and "topsecret" not in str(e.value.value) and "launcher.secret" in e.value.fix


def test_a_pod_runs_as_a_multinode_node_from_the_operators_environment():
    mn = kubernetes.pod_launcher({**K8S, "role": "pod"}, POD_ENV)
    assert mn == {"name": "kubernetes", "nnodes": 2, "nproc_per_node": None, "node_rank": 1,
                  "rdzv_endpoint": "exp42-node-0-0.exp42:29500", "rdzv_id": "exp42", "local_addr": "10.0.3.7",
                  "join_timeout_s": 600, "max_restarts": 0}
    multinode.check(mn)
    plan = make_plan(cfg(world_size=16, launcher={"name": "kubernetes", "nnodes": 2}), [])
    cmd = multinode.command(plan, mn, "/runs/exp42_smoke_w16")
    assert {"--nnodes=2", "--nproc-per-node=8", "--rdzv-backend=c10d", "--rdzv-endpoint=exp42-node-0-0.exp42:29500",
            "--rdzv-id=exp42", "--rdzv-conf=is_host=false", "--local-addr=10.0.3.7"} <= set(cmd)
    # Training Operator v1 with an elasticPolicy names the endpoint instead, and no node rank: torchrun assigns it.
    elastic = {k: v for k, v in POD_ENV.items() if not k.startswith(("PET_MASTER", "PET_NODE"))}
    mn = kubernetes.pod_launcher(K8S, {**elastic, "PET_RDZV_ENDPOINT": "exp42-worker-0:23456"})
    assert mn["rdzv_endpoint"] == "exp42-worker-0:23456" and mn["node_rank"] is None
    kubernetes.check_nproc(plan, POD_ENV)
    kubernetes.check_nproc(plan, {**POD_ENV, "PET_NPROC_PER_NODE": "auto"})


@pytest.mark.parametrize("missing", ["PET_NNODES", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT"])
def test_a_pod_without_the_operators_variable_is_refused_naming_it(missing):
    with pytest.raises(PlanError) as e:
        kubernetes.pod_launcher(K8S, {k: v for k, v in POD_ENV.items() if k != missing})
    assert e.value.key == missing and "PET_NNODES, PET_NODE_RANK" in e.value.fix


def test_a_pod_of_another_shape_is_refused():
    with pytest.raises(PlanError) as e:
        kubernetes.pod_launcher(K8S, {**POD_ENV, "PET_NNODES": "3"})
    assert e.value.key == "launcher.nodes" and "launcher.nodes=3" in e.value.fix
    with pytest.raises(PlanError) as e:
        kubernetes.pod_launcher(K8S, {**POD_ENV, "PET_NNODES": "1:2"})
    assert e.value.key == "PET_NNODES" and "elastic" in e.value.problem
    plan = make_plan(cfg(world_size=16, launcher={"name": "kubernetes", "nnodes": 2}), [])
    with pytest.raises(PlanError) as e:
        kubernetes.check_nproc(plan, {**POD_ENV, "PET_NPROC_PER_NODE": "4"})
    assert e.value.key == "PET_NPROC_PER_NODE" and "8 rank(s) per node" in e.value.problem


@pytest.mark.parametrize(("over", "root", "key"), [
    ({"job_name": "???"}, "/runs", "launcher.job_name"),
    ({"job_name": "Exp_42"}, "/runs", "launcher.job_name"),
    ({"image": "???"}, "/runs", "launcher.image"),
    ({"role": "driver"}, "/runs", "launcher.role"),
    ({"restart_policy": "Always"}, "/runs", "launcher.restart_policy"),
    ({"restart_policy": "Never"}, "/runs", "launcher.restart_policy"),
    ({"env": {"PET_NNODES": "4"}}, "/runs", "launcher.env.PET_NNODES"),
    ({"env": {"MASTER_ADDR": "x"}}, "/runs", "launcher.env.MASTER_ADDR"),
    ({"env": {"MASTER_PORT": "1"}}, "/runs", "launcher.env.MASTER_PORT"),
    ({"env": {"WORLD_SIZE": "8"}}, "/runs", "launcher.env.WORLD_SIZE"),
    ({"env": {"RANK": "0"}}, "/runs", "launcher.env.RANK"),
    ({"env": {"POD_IP": "1.2.3.4"}}, "/runs", "launcher.env.POD_IP"),
    ({"cpu_per_node": -3}, "/runs", "launcher.cpu_per_node"),
    ({"cpu_per_node": "0"}, "/runs", "launcher.cpu_per_node"),
    ({"memory_per_node": "lots"}, "/runs", "launcher.memory_per_node"),
    ({"termination_grace_s": 0}, "/runs", "launcher.termination_grace_s"),
    ({"secret": "Bad Name"}, "/runs", "launcher.secret"),
    ({"env": {"1X": "y"}}, "/runs", "launcher.env"),
    ({"volume": None}, "/runs", "output.root"),
    ({}, "runs", "output.root"),
])
def test_launcher_refusals_name_the_key(over, root, key):
    with pytest.raises(PlanError) as e:
        kubernetes.check({**K8S, **over}, root)
    assert e.value.key == key, e.value


def test_resources_that_are_kubernetes_quantities_pass():
    for cpu, mem in ((16, "64Gi"), ("500m", "512M"), ("1.5", "1e9"), (None, None)):
        kubernetes.check({**K8S, "cpu_per_node": cpu, "memory_per_node": mem}, "/runs")


def test_an_empty_pod_ip_is_refused_as_the_docs_say():
    with pytest.raises(PlanError) as e:
        kubernetes.pod_launcher(K8S, {**POD_ENV, "POD_IP": ""})
    assert e.value.key == "POD_IP" and "PET_NNODES" in e.value.fix
    # launcher.local_addr given: the pod's own address is not needed.
    assert kubernetes.pod_launcher({**K8S, "local_addr": "10.0.0.9"}, {**POD_ENV, "POD_IP": ""})["local_addr"] == (
        "10.0.0.9")


def test_a_secret_of_launcher_env_is_a_reference_to_the_jobs_secret():
    s = spec(env={"NCCL_DEBUG": "INFO", "HF_TOKEN": "hf_abc123"}, secret_env=("HF_TOKEN",))
    runtime, job, v1 = valid(km.training_runtime(s)), valid(km.train_job(s)), valid(km.pytorch_job(s))
    ref = {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "exp42-env", "key": "HF_TOKEN"}}}
    master = v1["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    assert ref in job["spec"]["trainer"]["env"] and ref in master["env"]
    assert "hf_abc123" not in yaml.safe_dump([runtime, job, v1])
    secret = valid(km.env_secret(s))
    assert secret["metadata"]["name"] == "exp42-env" and secret["stringData"] == {"HF_TOKEN": "hf_abc123"}


def test_an_object_store_root_needs_no_volume():
    kubernetes.check({**K8S, "volume": None}, "s3://bucket/runs")


def test_the_grace_period_must_hold_the_checkpoint_on_stop():
    kubernetes.check_grace({"launcher": K8S, "checkpoint": {"stop_grace_s": 20}})
    with pytest.raises(PlanError) as e:
        kubernetes.check_grace({"launcher": {**K8S, "termination_grace_s": 30}, "checkpoint": {"stop_grace_s": 20}})
    assert e.value.key == "launcher.termination_grace_s" and "termination_grace_s=39" in e.value.fix


class _Agent:
    """What exit_barrier.arrive reads of torchrun's agent."""

    def __init__(self, store: object | None, world: int | None) -> None:
        self._store, self._exit_barrier_timeout, self.arrived = store, 300.0, None
        self._worker_group = type("G", (), {"group_world_size": world})()

    def _exit_barrier(self) -> None:
        self.arrived = self._exit_barrier_timeout


def test_a_stopped_agent_arrives_at_the_exit_barrier_without_waiting_the_full_timeout():
    agent = _Agent(object(), 2)
    exit_barrier.arrive(agent)
    assert agent.arrived == exit_barrier.STOPPED_BARRIER_S
    before_rendezvous = _Agent(None, None)
    exit_barrier.arrive(before_rendezvous)
    assert before_rendezvous.arrived is None


def test_credentials_in_a_query_string_are_a_urls_credentials():
    from ddp_runner.contract import secrets

    url = "s3://bucket/p?region=eu&aws_secret_access_key=topsecret"
    assert secrets.redact_urls(url) == "s3://bucket/p?region=eu&aws_secret_access_key=***"
    assert secrets.url_secrets(url) == ["topsecret"] and secrets.is_redacted(secrets.redact_urls(url))
    assert secrets.redact_urls("https://h/o?X-Amz-Signature=abc&v=1") == "https://h/o?X-Amz-Signature=***&v=1"
    assert secrets.redact_urls("s3://bucket/p?versionId=3") == "s3://bucket/p?versionId=3"
    assert secrets.redact_urls("not a url?token=1") == "not a url?token=1"
