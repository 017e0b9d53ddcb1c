"""The Kubernetes objects of a ``launcher=kubernetes`` run, as plain dicts (pure; ``runner/launch/kubernetes.py``
decides what goes in and writes them).

Two ways to run the same pods, for the two Kubeflow operators in use:

- **Kubeflow Trainer v2** (``trainer.kubeflow.org/v1alpha1``): a namespaced ``TrainingRuntime`` holding the pod
  template (grace period, restart policy, volume, secret) and a ``TrainJob`` that refers to it and sets the trainer
  (image, command, nodes, processes and resources per node, env). The runtime is written rather than the stock
  ``torch-distributed`` ClusterTrainingRuntime referred to, because the grace period and the volume live in the
  pod template, and a runtime's template is the one place every v2 release (2.0 to 2.3) accepts them.
- **Training Operator v1** (``kubeflow.org/v1``): a ``PyTorchJob``, one Master and ``nodes - 1`` Workers.

A stop that saved its checkpoint (every pod exits 128 + the stop signal, 143) or a disruption never counts as a
failure: v1's replicas run with ``restartPolicy: ExitCode`` (pods with ``restartPolicy: Never``, one that exits
>= 128 deleted and made anew, so no container restart accrues toward ``runPolicy.backoffLimit``; < 128 fails the
job), v2's Job with a ``podFailurePolicy`` that ignores the stop's exit code and the ``DisruptionTarget``
condition (pods with ``restartPolicy: Never``). docs/kubernetes.md cites the upstream code.

Either operator starts every pod with the rendezvous in its environment (``PET_NNODES``, ``PET_NODE_RANK``,
``PET_NPROC_PER_NODE``, ``PET_MASTER_ADDR``, ``PET_MASTER_PORT``); the pods' command reads it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

TRAINER_API = "trainer.kubeflow.org/v1alpha1"
TRAINER_GROUP = "trainer.kubeflow.org"
PYTORCHJOB_API = "kubeflow.org/v1"
# Trainer v2: the torch plugin injects PET_* into the container named "node" of the replicated job "node" whose Job
# template carries this ancestor label; PET_MASTER_PORT is its fixed trainer port, 29500.
NODE = "node"
ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
RDZV_PORT = 29500
# Training Operator v1 reads the master's port from this container and port name (and sets PET_MASTER_PORT to it);
# the same port as Trainer v2's.
PYTORCH_CONTAINER = "pytorch"
PYTORCH_PORT_NAME = "pytorchjob-port"
POD_IP = "POD_IP"  # this pod's address, from the downward API: the address torchrun's agent publishes
VOLUME = "runs"
STOP_EXIT = 128 + 15  # a pod after a saved stop: 128 + SIGTERM, the pods' stop signal
# Training Operator v1: recreate a pod that exited >= 128 (a stop, a signal), fail the job on one < 128.
V1_RESTART_POLICY = "ExitCode"
# A --config-dir of the command line: its files in a ConfigMap, mounted read-only here in every pod.
CONF_VOLUME, CONF_MOUNT = "conf", "/etc/ddp-runner/conf"
DISRUPTION = "DisruptionTarget"  # the condition Kubernetes puts on a pod it preempts, evicts or drains
MANAGED_BY = {"app.kubernetes.io/managed-by": "ddp-runner"}


@dataclass
class PodSpec:
    """What every pod of the job gets, whichever operator starts it."""

    name: str
    image: str
    args: list[str]
    nodes: int
    nproc_per_node: int
    command: list[str] = field(default_factory=lambda: ["ddp-run"])
    namespace: str | None = None
    gpus_per_node: int = 0
    cpu_per_node: str | None = None
    memory_per_node: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    secret: str | None = None
    service_account: str | None = None
    volume: str | None = None
    mount_path: str | None = None
    grace_s: int = 60
    backoff_limit: int = 3
    stop_exit_codes: tuple[int, ...] = (STOP_EXIT,)  # the pods' exit codes after a saved stop
    secret_env: tuple[str, ...] = ()  # variables of ``env`` whose values live in the job's Secret (env_secret)
    config_files: Mapping[str, str] = field(default_factory=dict)  # a --config-dir: {relative path: text}

    @property
    def config_map_name(self) -> str:
        """The ConfigMap, written beside the job, that holds ``config_files``."""
        return f"{self.name}-conf"

    @property
    def env_secret(self) -> str:
        """The Secret, written beside the job, that holds the values of ``secret_env``."""
        return f"{self.name}-env"


def _metadata(spec: PodSpec, framework: bool = False) -> dict[str, Any]:
    labels = {**MANAGED_BY, **({"trainer.kubeflow.org/framework": "torch"} if framework else {})}
    meta: dict[str, Any] = {"name": spec.name}
    if spec.namespace:
        meta["namespace"] = spec.namespace
    meta["labels"] = labels
    return meta


def resources(spec: PodSpec) -> dict[str, Any]:
    """Requests and limits per pod (GPUs as limits, which Kubernetes also takes as the request)."""
    limits: dict[str, Any] = {}
    if spec.gpus_per_node:
        limits["nvidia.com/gpu"] = spec.gpus_per_node
    if spec.cpu_per_node is not None:
        limits["cpu"] = str(spec.cpu_per_node)
    if spec.memory_per_node is not None:
        limits["memory"] = str(spec.memory_per_node)
    out: dict[str, Any] = {"limits": limits} if limits else {}
    requests = {k: v for k, v in limits.items() if k != "nvidia.com/gpu"}
    if requests:
        out["requests"] = requests
    return out


def env_list(spec: PodSpec) -> list[dict[str, Any]]:
    """The container's variables: the pod's own address (downward API), then the user's (a secret's as a
    reference to the job's Secret: its value is in no manifest but the Secret's)."""

    def var(k: str, v: str) -> dict[str, Any]:
        if k in spec.secret_env:
            return {"name": k, "valueFrom": {"secretKeyRef": {"name": spec.env_secret, "key": k}}}
        return {"name": k, "value": v}

    return [{"name": POD_IP, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            *(var(str(k), str(v)) for k, v in spec.env.items())]


def env_secret(spec: PodSpec) -> dict[str, Any]:
    """The Secret holding the values of ``spec.secret_env`` (apply it before the job)."""
    meta = {**_metadata(spec), "name": spec.env_secret}
    return {"apiVersion": "v1", "kind": "Secret", "metadata": meta, "type": "Opaque",
            "stringData": {k: str(spec.env[k]) for k in spec.secret_env}}


def config_map(spec: PodSpec) -> dict[str, Any]:
    """The ConfigMap of the command line's ``--config-dir`` (keys ``f0``, ``f1``, …: a key holds no ``/``; the
    volume's items put each file back at its path)."""
    meta = {**_metadata(spec), "name": spec.config_map_name}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta,
            "data": {f"f{i}": text for i, text in enumerate(spec.config_files.values())}}


def pod_failure_policy(spec: PodSpec) -> dict[str, Any]:
    """Trainer v2's node Job: a pod that stopped after saving (its exit code) or was disrupted (preempted, evicted)
    is replaced without counting toward ``backoffLimit``; any other failure counts."""
    return {"rules": [
        {"action": "Ignore", "onPodConditions": [{"type": DISRUPTION, "status": "True"}]},
        {"action": "Ignore", "onExitCodes": {"containerName": NODE, "operator": "In",
                                             "values": sorted(set(spec.stop_exit_codes))}}]}


def _pod_extras(spec: PodSpec) -> dict[str, Any]:
    """Pod-level fields: the grace Kubernetes leaves between SIGTERM and SIGKILL, the account, the volume."""
    pod: dict[str, Any] = {"terminationGracePeriodSeconds": spec.grace_s}
    if spec.service_account:
        pod["serviceAccountName"] = spec.service_account
    volumes = [{"name": VOLUME, "persistentVolumeClaim": {"claimName": spec.volume}}] if spec.volume else []
    if spec.config_files:
        items = [{"key": f"f{i}", "path": path} for i, path in enumerate(spec.config_files)]
        volumes.append({"name": CONF_VOLUME, "configMap": {"name": spec.config_map_name, "items": items}})
    if volumes:
        pod["volumes"] = volumes
    return pod


def _container_extras(spec: PodSpec) -> dict[str, Any]:
    """Container fields both operators leave to the template: the secret's variables, the volume's mount."""
    out: dict[str, Any] = {}
    if spec.secret:
        out["envFrom"] = [{"secretRef": {"name": spec.secret}}]
    mounts = [{"name": VOLUME, "mountPath": spec.mount_path}] if spec.volume else []
    if spec.config_files:
        mounts.append({"name": CONF_VOLUME, "mountPath": CONF_MOUNT, "readOnly": True})
    if mounts:
        out["volumeMounts"] = mounts
    return out


def training_runtime(spec: PodSpec) -> dict[str, Any]:
    """Trainer v2's namespaced ``TrainingRuntime``: one replicated job ``node`` whose pods have the grace period,
    the volume and the secret, and whose Job ignores a stop and a disruption (:func:`pod_failure_policy`, which
    needs ``restartPolicy: Never``); the TrainJob fills in the trainer."""
    container = {"name": NODE, "image": spec.image, **_container_extras(spec)}
    pod = {"restartPolicy": "Never", **_pod_extras(spec), "containers": [container]}
    job = {"metadata": {"labels": {ANCESTOR_LABEL: "trainer"}},
           "spec": {"backoffLimit": spec.backoff_limit, "podFailurePolicy": pod_failure_policy(spec),
                    "template": {"spec": pod}}}
    return {"apiVersion": TRAINER_API, "kind": "TrainingRuntime", "metadata": _metadata(spec, framework=True),
            "spec": {"mlPolicy": {"numNodes": spec.nodes, "torch": {}},
                     "template": {"spec": {
                         # A failed node Job (its pods out of retries) restarts the whole set, which resumes.
                         "failurePolicy": {"maxRestarts": spec.backoff_limit},
                         "replicatedJobs": [{"name": NODE, "replicas": 1, "template": job}]}}}}


def train_job(spec: PodSpec) -> dict[str, Any]:
    """Trainer v2's ``TrainJob``: the runtime above, and the trainer every node runs."""
    trainer: dict[str, Any] = {"image": spec.image, "command": list(spec.command), "args": list(spec.args),
                               "numNodes": spec.nodes, "numProcPerNode": spec.nproc_per_node}
    if res := resources(spec):
        trainer["resourcesPerNode"] = res
    trainer["env"] = env_list(spec)
    return {"apiVersion": TRAINER_API, "kind": "TrainJob", "metadata": _metadata(spec),
            "spec": {"runtimeRef": {"name": spec.name, "apiGroup": TRAINER_GROUP, "kind": "TrainingRuntime"},
                     "trainer": trainer}}


def _replica(spec: PodSpec, replicas: int) -> dict[str, Any]:
    container: dict[str, Any] = {"name": PYTORCH_CONTAINER, "image": spec.image, "command": list(spec.command),
                                 "args": list(spec.args),
                                 "ports": [{"name": PYTORCH_PORT_NAME, "containerPort": RDZV_PORT}],
                                 "env": env_list(spec), **_container_extras(spec)}
    if res := resources(spec):
        container["resources"] = res
    return {"replicas": replicas, "restartPolicy": V1_RESTART_POLICY,
            "template": {"spec": {**_pod_extras(spec), "containers": [container]}}}


def pytorch_job(spec: PodSpec) -> dict[str, Any]:
    """Training Operator v1's ``PyTorchJob``: the Master is node 0 (its service is PET_MASTER_ADDR), each Worker
    ``i`` node ``i + 1``, every replica ``restartPolicy: ExitCode``. No ``elasticPolicy``: the node count is fixed,
    as the plan's world size is."""
    replicas = {"Master": _replica(spec, 1)}
    if spec.nodes > 1:
        replicas["Worker"] = _replica(spec, spec.nodes - 1)
    return {"apiVersion": PYTORCHJOB_API, "kind": "PyTorchJob", "metadata": _metadata(spec),
            "spec": {"nprocPerNode": str(spec.nproc_per_node), "runPolicy": {"backoffLimit": spec.backoff_limit},
                     "pytorchReplicaSpecs": replicas}}


def to_yaml(objects: Sequence[Mapping[str, Any]], header: Sequence[str] = ()) -> str:
    """The objects as one multi-document YAML file, ``header`` as comment lines on top."""
    import yaml

    docs = "---\n".join(yaml.safe_dump(dict(o), sort_keys=False, default_flow_style=False, width=120)
                        for o in objects)
    return "".join(f"# {line}\n" for line in header) + docs
