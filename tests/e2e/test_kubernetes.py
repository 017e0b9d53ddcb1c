"""launcher=kubernetes without a cluster: the job's two pods as two local process trees, each running the command
its manifest gives (``ddp-run … launcher.role=pod``) with exactly the environment the Kubeflow operator sets on
that pod. They train together into one run directory; Kubernetes preempting one pod (SIGTERM to its PID 1, the
driver) ends the run with a checkpoint of the step every rank agreed on, and the pods started again resume it.
(kubectl and a cluster are not needed: tests/integration/test_kubernetes_cli.py checks the manifests.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from typing import Any

import yaml
from test_multinode import finish

from ddp_runner.contract import layout
from tests.support.ports import free_port
from tests.support.recipes import rank0_sleeps
from tests.support.run_tree import load_json, run_dirs
from tests.support.waiting import wait_for

STEPS = 16
# Rank 0 sleeps 0.25 s after every step: the preemption lands mid-run, whatever the machine's load.
POD_ARGS = ["task=smoke", "device=cpu", "world_size=2", "launcher=kubernetes", "launcher.nodes=2",
            "launcher.job_name=kube1", "launcher.image=registry.example/ddp-runner:test", "launcher.volume=runs",
            f"train.max_steps={STEPS}", "checkpoint.every_steps=2", "checkpoint.async_save=false", "timeout_s=60",
            *rank0_sleeps(0.25)]


def pod_env(doc: dict[str, Any], rank: int, port: int) -> dict[str, str]:
    """The variables the operator sets on pod ``rank`` of the job ``doc`` (a TrainJob or a PyTorchJob), with
    the master's address and port as one host has them (127.0.0.1 and a free port, where a cluster has
    ``<job>-node-0-0.<job>:29500`` or ``<job>-master-0:29500``), and the pod's own address (downward API) too."""
    if doc["kind"] == "TrainJob":  # Kubeflow Trainer v2's torch plugin
        trainer = doc["spec"]["trainer"]
        env = {"PET_NNODES": str(trainer["numNodes"]), "PET_NPROC_PER_NODE": str(trainer["numProcPerNode"]),
               "PET_NODE_RANK": str(rank), "PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": str(port)}
        container = trainer
    else:  # Training Operator v1: Master is node 0, Worker i node i + 1
        replicas = doc["spec"]["pytorchReplicaSpecs"]
        nodes, nproc = sum(r["replicas"] for r in replicas.values()), int(doc["spec"]["nprocPerNode"])
        env = {"PYTHONUNBUFFERED": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": str(port), "WORLD_SIZE": str(nodes * nproc),
               "RANK": str(rank), "PET_NODE_RANK": str(rank), "PET_NPROC_PER_NODE": str(nproc),
               "PET_NNODES": str(nodes)}
        container = replicas["Master" if rank == 0 else "Worker"]["template"]["spec"]["containers"][0]
    for var in container["env"]:
        assert var.get("value") is not None or var["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
        env[var["name"]] = var.get("value", "127.0.0.1")
    return env


def pod_command(doc: dict[str, Any], rank: int) -> list[str]:
    """The pod's command and arguments, ``ddp-run`` being this interpreter's ``python -m ddp_runner``."""
    if doc["kind"] == "TrainJob":
        container = doc["spec"]["trainer"]
    else:
        container = doc["spec"]["pytorchReplicaSpecs"]["Master" if rank == 0 else "Worker"]["template"]["spec"][
            "containers"][0]
    assert container["command"] == ["ddp-run"]
    return [sys.executable, "-m", "ddp_runner", *container["args"]]


def start_pod(doc: dict[str, Any], rank: int, port: int) -> subprocess.Popen[str]:
    """One pod: its own process tree (the driver is its PID 1), its own environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PET_")}
    return subprocess.Popen(pod_command(doc, rank), cwd=tempfile.gettempdir(), env={**env, **pod_env(doc, rank, port)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_two_pods_train_together_and_resume_after_one_is_preempted(cli, tmp_path, out_root):
    # The workstation writes the manifests (main() in this process: nothing is launched).
    manifests = tmp_path / "k8s"
    r = cli([*POD_ARGS, f"launcher.manifest_dir={manifests}"], out_root)
    assert r.returncode == 0, r.stderr
    [trainjob] = yaml.safe_load_all((manifests / "kube1" / "trainjob.yaml").read_text())
    [pytorchjob] = yaml.safe_load_all((manifests / "kube1" / "pytorchjob.yaml").read_text())
    assert trainjob["spec"]["trainer"]["args"][-2:] == ["checkpoint.stop_signal=SIGTERM", "launcher.role=pod"]

    # The TrainJob's two pods train; Kubernetes preempts pod 1 once step 2's checkpoint is committed.
    port = free_port()
    pods = [start_pod(trainjob, rank, port) for rank in (0, 1)]
    run = out_root / "kube1_smoke_w2"
    wait_for("step 2's checkpoint", lambda: (run / "checkpoints" / "step_2" / "meta.json").exists(), driver=pods[0])
    pods[1].send_signal(signal.SIGTERM)
    # Both pods end at once (no agent waits out torchrun's 300 s exit barrier), non-zero: Kubernetes restarts them.
    (rc0, out0, err0), (rc1, _, err1) = finish(*pods, timeout=90)
    assert rc0 == rc1 == 128 + signal.SIGTERM, out0 + err0 + err1
    assert run_dirs(out_root) == [run]
    summary, facts = load_json(run / "summary.json"), load_json(run / layout.rank_facts(1))
    assert summary["status"] == "preempted" and summary["root_cause"] is None, summary
    stopped = facts["stopped"]["step"]
    assert 2 <= stopped < STEPS and (run / "checkpoints" / f"step_{stopped}" / "meta.json").exists()
    assert f"PREEMPTED by SIGTERM: every rank stopped after step {stopped}" in err0
    assert load_json(run / layout.node_record(1))["status"] == layout.STATUS_INTERRUPTED

    # The pods started again (this time the PyTorchJob's: the same command, the v1 operator's variables) continue
    # the run directory from that checkpoint to the end.
    pods = [start_pod(pytorchjob, rank, port) for rank in (0, 1)]  # the master's port is fixed in a cluster too
    (rc0, out0, err0), (rc1, out1, err1) = finish(*pods, timeout=120)
    assert rc0 == rc1 == 0, out0 + err0 + out1 + err1
    assert run_dirs(out_root) == [run]
    summary, manifest = load_json(run / "summary.json"), load_json(run / "run.json")
    assert summary["status"] == "completed" and summary["steps"] == STEPS, summary
    assert len(manifest["continued"]) == 1 and sorted(manifest["nodes"]) == ["0", "1"]
    assert f"resumed from step {stopped} of {run} (checkpoint step_{stopped})" in out0, out0
    assert len(summary["losses"]) == STEPS


def test_a_pod_whose_ddp_run_is_killed_is_told_as_a_lost_peer_not_a_preemption(cli, tmp_path, out_root):
    manifests = tmp_path / "k8s"
    assert cli([*POD_ARGS, f"launcher.manifest_dir={manifests}"], out_root).returncode == 0
    [trainjob] = yaml.safe_load_all((manifests / "kube1" / "trainjob.yaml").read_text())
    port = free_port()
    pods = [start_pod(trainjob, rank, port) for rank in (0, 1)]
    run = out_root / "kube1_smoke_w2"
    wait_for("step 2's checkpoint", lambda: (run / "checkpoints" / "step_2" / "meta.json").exists(), driver=pods[0])
    pods[1].send_signal(signal.SIGKILL)  # pod 1's PID 1 killed: nothing sends SIGTERM to any pod
    (rc0, out0, err0), _ = finish(*pods, timeout=90)
    # The headline itself names the lost node and the step every rank stopped after; no signal is blamed.
    stopped = load_json(run / layout.rank_facts(0))["stopped"]["step"]
    assert "ddp-run: PREEMPTED: node 1 (host " in err0 and "by SIGTERM" not in err0, out0 + err0
    assert f"every rank stopped after step {stopped} (this node's driver was sent no signal)" in err0, err0
    assert rc0 == 128 + signal.SIGTERM  # a saved stop: the manifests' failure policies never count it
    summary = load_json(run / "summary.json")
    assert summary["status"] == "preempted" and summary["lost_nodes"]["nodes"] == ["1"], summary
    steps = summary["lost_nodes"]["last_steps"]
    assert set(steps) == {"0", "1"} and all(isinstance(v, int) and v >= 2 for v in steps.values()), steps


def test_pod_env_is_what_the_operators_set():
    # The test's stand-in for the operators, on a TrainJob and a PyTorchJob of three nodes.
    from ddp_runner.launch import kube_manifest as km

    spec = km.PodSpec(name="j", image="i", args=["task=smoke"], nodes=3, nproc_per_node=2, env={"A": "b"})
    v2 = pod_env(km.train_job(spec), 2, 29500)
    assert v2 == {"PET_NNODES": "3", "PET_NPROC_PER_NODE": "2", "PET_NODE_RANK": "2", "PET_MASTER_ADDR": "127.0.0.1",
                  "PET_MASTER_PORT": "29500", "POD_IP": "127.0.0.1", "A": "b"}
    v1 = pod_env(km.pytorch_job(spec), 0, 29500)
    assert (v1["WORLD_SIZE"], v1["RANK"], v1["PET_NODE_RANK"], v1["PET_NNODES"]) == ("6", "0", "0", "3")
