"""A preemption never fails a Kubernetes job, a real failure still counts: upstream's own rules, transcribed from
their code, applied to the manifests ddp-run writes for a 4-node job.

- Training Operator v1 (kubeflow/trainer, tag v1.9.4; the same in v1.8.0): ``pkg/core/pod.go`` SetRestartPolicy
  (``ExitCode`` runs the pod with ``restartPolicy: Never``); ``pkg/controller.v1/common/pod.go`` ReconcilePods (a
  failed pod: ``ExitCode`` and exit >= 128 (``pkg/util/train/train_util.go`` IsRetryableExitCode), ``OnFailure`` or
  ``Always``: deleted and made anew; ``ExitCode`` and exit < 128: the job fails); ``pkg/core/job.go``
  PastBackoffLimit (the container restarts of the *running* pods of OnFailure/Always/ExitCode replicas, summed,
  against ``runPolicy.backoffLimit``).
- Kubernetes Job (Trainer v2's node Job; kubernetes/kubernetes ``pkg/controller/job/pod_failure_policy.go``
  matchPodFailurePolicy: a failed pod matching an ``Ignore`` rule is not counted; ``pkg/controller/job/
  job_controller.go``: a Job fails once its counted failed pods exceed ``backoffLimit``, or, with pods
  ``restartPolicy: OnFailure``, once their container restarts reach it (pastBackoffLimitOnFailure)).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ddp_runner.launch import kube_manifest as km

NODES, STOP, REAL_FAILURE = 4, 143, 1


@dataclass
class Pod:
    """A pod as the controllers see it: its phase, its container's restarts and last exit code, its conditions."""

    phase: str = "Running"
    restarts: int = 0
    exit_code: int | None = None
    conditions: list[dict[str, str]] = field(default_factory=list)


def v1_pod_restart_policy(replica: dict[str, Any]) -> str:
    """pkg/core/pod.go SetRestartPolicy: ExitCode is no pod policy; the pod runs with Never."""
    policy = replica["restartPolicy"]
    return "Never" if policy == "ExitCode" else policy


def end(pod: Pod, code: int, pod_policy: str, disrupted: bool = False) -> None:
    """The kubelet: a container that exits non-zero is restarted in place under OnFailure/Always (the pod stays
    Running, restartCount + 1); under Never the pod is Failed."""
    if disrupted:
        pod.conditions.append({"type": "DisruptionTarget", "status": "True"})
    if pod_policy in ("OnFailure", "Always"):
        pod.restarts += 1
    else:
        pod.phase, pod.exit_code = "Failed", code


def v1_reconcile(job: dict[str, Any], pods: dict[str, list[Pod]]) -> str:
    """pkg/controller.v1/common/pod.go ReconcilePods, then pkg/core/job.go PastBackoffLimit: Failed, or Running."""
    replicas = job["spec"]["pytorchReplicaSpecs"]
    for rtype, spec in replicas.items():
        for i, pod in enumerate(pods[rtype]):
            if pod.phase != "Failed":
                continue
            retryable = (spec["restartPolicy"] == "ExitCode" and pod.exit_code >= 128
                         or spec["restartPolicy"] in ("OnFailure", "Always"))
            if retryable:
                pods[rtype][i] = Pod()  # deleted; the next reconcile creates it anew (restartCount 0)
            elif spec["restartPolicy"] == "ExitCode":
                return "Failed"  # "has a non-retryable exit code. Failing job."
            else:
                return "Failed"  # Never: the PyTorchJob's UpdateJobStatus fails it at a failed replica
    limit = job["spec"]["runPolicy"]["backoffLimit"]
    counted = sum(p.restarts for rtype, spec in replicas.items()
                  if spec["restartPolicy"] in ("OnFailure", "Always", "ExitCode")
                  for p in pods[rtype] if p.phase == "Running")
    return "Failed" if (counted > 0 if limit == 0 else counted >= limit) else "Running"


def v1_pods(job: dict[str, Any]) -> dict[str, list[Pod]]:
    return {rtype: [Pod() for _ in range(spec["replicas"])]
            for rtype, spec in job["spec"]["pytorchReplicaSpecs"].items()}


def v1_preemption(job: dict[str, Any], pods: dict[str, list[Pod]]) -> None:
    """One pod (Worker 0) preempted: it saves and exits 143; so does every other pod (the stop is the run's)."""
    for rtype, spec in job["spec"]["pytorchReplicaSpecs"].items():
        for i, pod in enumerate(pods[rtype]):
            end(pod, STOP, v1_pod_restart_policy(spec), disrupted=(rtype, i) == ("Worker", 0))


def node_job(runtime: dict[str, Any]) -> dict[str, Any]:
    [node] = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    return node["template"]["spec"]


def counts(policy: dict[str, Any] | None, pod: Pod, container: str) -> bool:
    """pod_failure_policy.go matchPodFailurePolicy: does this failed pod count toward backoffLimit?"""
    for rule in (policy or {}).get("rules", []):
        if on := rule.get("onExitCodes"):
            hit = (pod.exit_code != 0 and on.get("containerName") in (None, container)
                   and (pod.exit_code in on["values"]) == (on["operator"] == "In"))
        else:
            hit = any(c in pod.conditions for c in rule["onPodConditions"])
        if hit:
            return rule["action"] != "Ignore"
    return True


def v2_status(job_spec: dict[str, Any], pods: list[Pod]) -> str:
    """job_controller.go: Failed once the counted failures exceed backoffLimit (restarts under OnFailure)."""
    limit, policy = job_spec["backoffLimit"], job_spec.get("podFailurePolicy")
    if job_spec["template"]["spec"]["restartPolicy"] == "OnFailure":
        failed = sum(p.restarts for p in pods)
        return "Failed" if failed > limit or (failed >= limit and limit > 0) else "Running"
    failed = sum(counts(policy, p, km.NODE) for p in pods if p.phase == "Failed")
    return "Failed" if failed > limit else "Running"


def v2_round(job_spec: dict[str, Any], pods: list[Pod], codes: list[int], preempted: int | None) -> list[Pod]:
    """Every pod ends with its code; the Job replaces the failed ones (keeping them in its count)."""
    policy = job_spec["template"]["spec"]["restartPolicy"]
    for i, (pod, code) in enumerate(zip(pods, codes, strict=True)):
        end(pod, code, policy, disrupted=i == preempted)
    return pods


def spec() -> km.PodSpec:
    return km.PodSpec(name="exp42", image="i", args=["task=gpt"], nodes=NODES, nproc_per_node=8, backoff_limit=3)


def test_v1_a_preemption_of_a_4_node_job_never_fails_it_a_real_failure_does():
    job = km.pytorch_job(spec())
    pods = v1_pods(job)
    for _ in range(10):  # ten preemptions in a row: every pod recreated each time, nothing counted
        v1_preemption(job, pods)
        assert v1_reconcile(job, pods) == "Running"
    assert all(p.restarts == 0 and p.phase == "Running" for ps in pods.values() for p in ps)
    end(pods["Worker"][1], REAL_FAILURE, v1_pod_restart_policy(job["spec"]["pytorchReplicaSpecs"]["Worker"]))
    assert v1_reconcile(job, pods) == "Failed", "exit 1 is a real failure: it counts (and fails the job)"


def test_v1_the_old_on_failure_manifest_fails_at_the_first_preemption_of_4_nodes():
    # The rule above is the operator's: under OnFailure, the 4 in-place restarts of one preemption reach 3.
    job = km.pytorch_job(spec())
    for replica in job["spec"]["pytorchReplicaSpecs"].values():
        replica["restartPolicy"] = "OnFailure"
    pods = v1_pods(job)
    v1_preemption(job, pods)
    assert v1_reconcile(job, pods) == "Failed"


def test_v2_a_preemption_of_a_4_node_job_never_fails_it_a_real_failure_counts():
    job_spec = node_job(km.training_runtime(spec()))
    for _ in range(10):
        pods = v2_round(job_spec, [Pod() for _ in range(NODES)], [STOP] * NODES, preempted=1)
        assert v2_status(job_spec, pods) == "Running"
    # A pod SIGKILLed at the end of its grace, preempted: the DisruptionTarget condition makes it ignored too.
    pods = v2_round(job_spec, [Pod() for _ in range(NODES)], [137, STOP, STOP, STOP], preempted=0)
    assert v2_status(job_spec, pods) == "Running"
    failed = [Pod() for _ in range(NODES)]
    for _ in range(job_spec["backoffLimit"] + 1):  # exit 1, the stop of the others: only the exit 1s count
        failed += v2_round(job_spec, [Pod() for _ in range(NODES)], [REAL_FAILURE, STOP, STOP, STOP], None)
    assert v2_status(job_spec, failed) == "Failed"
    assert not counts(job_spec["podFailurePolicy"], Pod("Failed", exit_code=STOP), km.NODE)
    assert counts(job_spec["podFailurePolicy"], Pod("Failed", exit_code=REAL_FAILURE), km.NODE)


def test_v2_the_old_on_failure_manifest_fails_after_one_preemption_of_4_nodes():
    job_spec = node_job(km.training_runtime(spec()))
    job_spec["template"]["spec"]["restartPolicy"] = "OnFailure"
    pods = v2_round(job_spec, [Pod() for _ in range(NODES)], [STOP] * NODES, preempted=1)
    assert v2_status(job_spec, pods) == "Failed"


def test_the_stop_signal_of_the_command_line_is_ignored_too():
    s = spec()
    s.stop_exit_codes = (140, 143)  # checkpoint.stop_signal=SIGUSR2 named on the command line
    rule = node_job(km.training_runtime(s))["podFailurePolicy"]["rules"][1]
    assert rule["onExitCodes"]["values"] == [140, 143]
