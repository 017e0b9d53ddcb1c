"""launcher=kubernetes: a Kubeflow job for the run, and each of its pods one node of a multi-node run.

Two roles, one command line:

- ``launcher.role=manifest`` (on your workstation): plans the run, then writes ``<manifest_dir>/<job_name>/
  trainjob.yaml`` (Kubeflow Trainer v2: a TrainingRuntime and a TrainJob) and ``pytorchjob.yaml`` (Training Operator
  v1), whose every pod runs this same ``ddp-run`` command line with ``launcher.role=pod``. Nothing else is
  created; ``kubectl apply -f`` submits one of them.
- ``launcher.role=pod`` (the pods' command): reads the rendezvous the operator put into the pod's environment
  (``PET_NNODES``, ``PET_NODE_RANK``, ``PET_NPROC_PER_NODE``, ``PET_MASTER_ADDR``/``PET_MASTER_PORT`` or
  ``PET_RDZV_ENDPOINT``) and runs as ``launcher=multinode`` with those values: node 0's pod opens (or continues)
  ``<output.root>/<job_name>_<task>_w<world_size>``, the others join it. A pod restarted or recreated by
  Kubernetes runs the same command again and the run resumes from its newest checkpoint.

Kubernetes stops a pod with SIGTERM to its PID 1 (``ddp-run``), then SIGKILL after
``terminationGracePeriodSeconds``: the pods' command makes SIGTERM the pre-emption signal
(``checkpoint.stop_signal=SIGTERM``), so that every rank saves at the next step and the run ends ``preempted``,
as under Slurm; the manifests' grace period leaves the time for it.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from typing import Any

from ddp_runner.config.plan import Plan
from ddp_runner.contract import layout, secrets, stops
from ddp_runner.contract.errors import PlanError
from ddp_runner.contract.rules import check_keys, choice, integer, text
from ddp_runner.launch import kube_checks, kube_config, kube_submit, multinode
from ddp_runner.launch import kube_manifest as km
from ddp_runner.launch.base import BaseLauncher, Job
from ddp_runner.rundir.run_dir import RunDir

# What the operators set on every pod (Trainer v2's torch plugin; Training Operator v1, which also sets
# MASTER_ADDR, MASTER_PORT, WORLD_SIZE and RANK: torchrun sets those for the ranks itself).
PET_NNODES = "PET_NNODES"
PET_NODE_RANK = "PET_NODE_RANK"
PET_NPROC_PER_NODE = "PET_NPROC_PER_NODE"
PET_MASTER_ADDR = "PET_MASTER_ADDR"
PET_MASTER_PORT = "PET_MASTER_PORT"
PET_RDZV_ENDPOINT = "PET_RDZV_ENDPOINT"  # Training Operator v1 with an elasticPolicy, instead of the master's

MANIFEST, POD = "manifest", "pod"
# Kubernetes names: a DNS-1035 label for the job (its pods and services are named after it, within 63 characters),
# DNS-1123 subdomains for the objects it refers to.
_JOB_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,38}[a-z0-9])?$")
_OBJECT_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
# After the checkpoint on stop, the driver writes the summary (and mirrors an s3:// run): seconds left for that.
FINISH_MARGIN_S = 15
# Workstation-only keys: never passed on to the pods' command. launcher.env reaches the pods as their environment
# (a secret's value through the job's Secret), never as an argument.
_NOT_FOR_PODS = ("launcher.role", "launcher.manifest_dir", "dry_run", "launcher.env")

RULES = (
    choice("launcher.role", (MANIFEST, POD)),
    text("launcher.image", example="registry.example/ddp-runner:1.0"),
    integer("launcher.nodes", lo=1, example="2"),
    integer("launcher.gpus_per_node", lo=0, null=True, example="8"),
    integer("launcher.termination_grace_s", lo=1, example="60"),
    choice("launcher.restart_policy", ("OnFailure",)),
    integer("launcher.backoff_limit", lo=0, example="3"),
    integer("launcher.join_timeout_s", lo=1, example="600"),
    text("launcher.manifest_dir", example="kubernetes"),
)


def role(launcher: Mapping[str, Any]) -> str:
    """``manifest`` (write the job's manifests) or ``pod`` (run as one node of that job)."""
    return str(launcher.get("role") or MANIFEST)


def check(launcher: Mapping[str, Any], output_root: str) -> None:
    """Refuse, before anything starts, a config the job's manifests or its pods could not run."""
    job_name = launcher.get("job_name")
    if job_name in (None, "", "???"):
        raise PlanError("launcher.job_name", job_name, "is required by launcher=kubernetes",
                        "name the job, e.g. launcher.job_name=exp42 (it also names the run directory)")
    if not isinstance(job_name, str) or not _JOB_NAME.match(job_name):
        raise PlanError("launcher.job_name", job_name, "is not a Kubernetes job name: lowercase letters, digits and"
                        " '-', starting with a letter, at most 40 characters (its pods are named after it)",
                        "e.g. launcher.job_name=exp42")
    if launcher.get("restart_policy") == "Never":
        raise PlanError("launcher.restart_policy", "Never", "would end the PyTorchJob at the first pod that stops, a"
                        " preemption that saved its checkpoint too", "leave launcher.restart_policy=OnFailure: a stop"
                        " (exit >= 128) makes the pod anew, a real failure (exit < 128) still fails the job; to fail"
                        " a TrainJob at the first real failure too, use launcher.backoff_limit=0")
    if launcher.get("image") in ("???", None, ""):
        raise PlanError("launcher.image", launcher.get("image"), "is required by launcher=kubernetes",
                        "give the image the pods run, with this package installed (ddp-run on its PATH), e.g."
                        " launcher.image=registry.example/ddp-runner:1.0")
    check_keys({"launcher": launcher}, RULES)
    for key in ("namespace", "volume", "secret", "service_account"):
        value = launcher.get(key)
        if value is not None and not (isinstance(value, str) and _OBJECT_NAME.match(value)):
            raise PlanError(f"launcher.{key}", value, "is not a Kubernetes object name (lowercase letters, digits,"
                            " '-' and '.')", f"give the name as kubectl shows it, or launcher.{key}=null")
    env = launcher.get("env") or {}
    if not isinstance(env, Mapping) or any(not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", str(k)) for k in env):
        raise PlanError("launcher.env", env, "must map variable names to values",
                        "e.g. 'launcher.env={NCCL_DEBUG:INFO}'")
    kube_checks.check_env(env)
    # A secret typed into launcher.env (its name says so) is masked wherever the console shows it, a dry run too.
    secrets.KNOWN.update(str(env[k]) for k in kube_checks.secret_names(env, None))
    kube_checks.check_resources(launcher)
    check_root(launcher, output_root)
    if role(launcher) == POD:
        multinode.check(pod_launcher(launcher))
    else:
        pod_args(_hydra_overrides()[0])  # refuses what the manifests must not hold, before a dry run prints them


def check_root(launcher: Mapping[str, Any], output_root: str) -> None:
    """The run directory must be one every pod reaches: an object store, or a volume mounted at ``output.root``."""
    import fsspec

    protocol, path = fsspec.core.split_protocol(str(output_root))
    if protocol not in (None, "file", "local"):
        return  # s3://… every pod reaches (its credentials: launcher.secret or launcher.service_account)
    if not launcher.get("volume"):
        raise PlanError("output.root", output_root, "is a folder inside each pod, which the pods do not share",
                        "give a PersistentVolumeClaim every pod mounts (ReadWriteMany) with launcher.volume=<claim>"
                        " and an absolute output.root (it is mounted there), or an s3:// output.root")
    if not os.path.isabs(path):
        raise PlanError("output.root", output_root, "must be an absolute path: launcher.volume is mounted there in"
                        " every pod", "e.g. output.root=/runs")


def pod_launcher(launcher: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Inside a pod: the ``launcher=multinode`` config this pod runs, from the variables the operator set (a
    refusal naming the first one missing)."""
    environ = os.environ if environ is None else environ

    def need(name: str) -> str:
        value = environ.get(name)
        if value in (None, ""):
            raise PlanError(name, None, "is not set in this pod's environment (launcher.role=pod reads the rendezvous"
                            " from the variables the Kubeflow operator sets on every pod)",
                            "run this command in a pod of the TrainJob or PyTorchJob that ddp-run launcher=kubernetes"
                            f" wrote; to try it by hand, export {PET_NNODES}, {PET_NODE_RANK}, {PET_NPROC_PER_NODE},"
                            f" {PET_MASTER_ADDR} and {PET_MASTER_PORT} as the operator would")
        return str(value)

    nnodes = need(PET_NNODES)
    if not nnodes.isdigit():
        raise PlanError(PET_NNODES, nnodes, "is not a node count (an elastic range?): launcher=kubernetes runs a"
                        " fixed number of nodes, the plan's", "run the manifests ddp-run launcher=kubernetes wrote"
                        " (no elasticPolicy), or launcher=multinode for elastic ranges")
    if int(nnodes) != launcher.get("nnodes", launcher.get("nodes")):
        raise PlanError("launcher.nodes", launcher.get("nodes"), f"this pod's job runs {PET_NNODES}={nnodes} nodes",
                        f"write the manifests again with launcher.nodes={nnodes}, or give the job"
                        f" {launcher.get('nodes')} nodes")
    endpoint = environ.get(PET_RDZV_ENDPOINT) or f"{need(PET_MASTER_ADDR)}:{need(PET_MASTER_PORT)}"
    local_addr = launcher.get("local_addr") or (need(km.POD_IP) if km.POD_IP in environ else None)
    # An elastic v1 job (PET_RDZV_ENDPOINT) gives no node rank: torchrun assigns ranks, as with node_rank=null.
    rank = environ.get(PET_NODE_RANK) if environ.get(PET_RDZV_ENDPOINT) else need(PET_NODE_RANK)
    if rank not in (None, "") and not str(rank).isdigit():
        raise PlanError(PET_NODE_RANK, rank, "is not a node rank", "a pod of the job gets 0, 1, … from the operator")
    return {"name": "kubernetes", "nnodes": int(nnodes), "nproc_per_node": launcher.get("nproc_per_node"),
            "node_rank": int(rank) if rank not in (None, "") else None, "rdzv_endpoint": endpoint,
            "rdzv_id": launcher["job_name"], "local_addr": local_addr,
            "join_timeout_s": launcher.get("join_timeout_s", 600), "max_restarts": launcher.get("max_restarts", 0)}


def check_nproc(plan: Plan, environ: Mapping[str, str] | None = None) -> None:
    """Inside a pod: the operator's processes per node must be the plan's (``auto``/``gpu``/``cpu``: the plan's)."""
    value = str((os.environ if environ is None else environ).get(PET_NPROC_PER_NODE) or "")
    if value.isdigit() and int(value) != plan.nproc_per_node:
        raise PlanError(PET_NPROC_PER_NODE, value, f"the plan runs {plan.nproc_per_node} rank(s) per node"
                        f" (world_size={plan.world_size} over {plan.nnodes} nodes)",
                        "write the manifests again from the same world_size and launcher.nodes as the pods' command")


def _hydra_overrides() -> tuple[list[str], bool]:
    """The command line's overrides as Hydra recorded them, and whether this is a sweep (``-m``)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized():
        return [], False
    hc = HydraConfig.get()
    return list(hc.overrides.task), hc.mode == RunMode.MULTIRUN


def pod_args(overrides: list[str]) -> list[str]:
    """The pods' ``ddp-run`` arguments: this command line's, as a pod of the job (``launcher.role=pod``), with
    SIGTERM (what Kubernetes sends) as the pre-emption signal unless the command line names another."""
    keys = [o.split("=", 1)[0].lstrip("+~") for o in overrides]
    args = [o for o, k in zip(overrides, keys, strict=True)
            if k not in _NOT_FOR_PODS and not k.startswith("launcher.env.")]
    for arg in args:
        if secrets.redact_urls(arg) != arg:
            raise PlanError(arg.split("=", 1)[0], secrets.redact_urls(arg.split("=", 1)[-1]),
                            "carries credentials, which the manifests would hold in plain text",
                            "give them to the pods through a Secret (launcher.secret=<name>: its keys become the"
                            " pods' environment, e.g. AWS_ACCESS_KEY_ID) and leave them out of the URL")
    if "checkpoint.stop_signal" not in keys:
        args.append("checkpoint.stop_signal=SIGTERM")
    # Kubernetes expands $(VAR) in a container's args: a literal one is written $$(VAR).
    return [a.replace("$(", "$$(") for a in args] + ["launcher.role=pod"]


def run_url(conf: Mapping[str, Any], plan: Plan) -> str:
    """The run directory node 0's pod opens: ``<output.root>/<job_name>_<task>_w<world_size>``."""
    name = layout.job_run_name(str(conf["launcher"]["job_name"]), conf["task"]["name"], plan.world_size)
    return layout.join(str(conf["output"]["root"]).rstrip("/") or "/", name)


def stop_exit_codes(conf: Mapping[str, Any], args: list[str]) -> tuple[int, ...]:
    """The pods' exit codes after a saved stop: 128 + SIGTERM (Kubernetes' stop, the pods' stop signal unless the
    command line names another, whose exit code is added)."""
    named = any(a.split("=", 1)[0].lstrip("+~") == "checkpoint.stop_signal" for a in args)
    signum = stops.of(conf.get("checkpoint"))[0] if named else None
    return tuple(sorted({km.STOP_EXIT, *((128 + signum,) if signum else ())}))


def pod_spec(conf: Mapping[str, Any], plan: Plan, args: list[str], device_given: str | None,
             secret_env: tuple[str, ...] = ()) -> km.PodSpec:
    """What every pod of the job gets. GPUs per pod: ``launcher.gpus_per_node``, else one per rank unless the
    command line says ``device=cpu`` (this host's own devices say nothing of the pods')."""
    launcher = conf["launcher"]
    gpus = launcher.get("gpus_per_node")
    if gpus is None:
        gpus = 0 if device_given == "cpu" else plan.nproc_per_node
    import fsspec

    return km.PodSpec(
        name=launcher["job_name"], image=launcher["image"], args=args, nodes=plan.nnodes,
        nproc_per_node=plan.nproc_per_node, namespace=launcher.get("namespace"), gpus_per_node=int(gpus),
        cpu_per_node=launcher.get("cpu_per_node"), memory_per_node=launcher.get("memory_per_node"),
        env={str(k): str(v) for k, v in (launcher.get("env") or {}).items()}, secret=launcher.get("secret"),
        secret_env=tuple(secret_env), stop_exit_codes=stop_exit_codes(conf, args),
        service_account=launcher.get("service_account"), volume=launcher.get("volume"),
        mount_path=fsspec.core.split_protocol(str(conf["output"]["root"]))[1] if launcher.get("volume") else None,
        grace_s=int(launcher.get("termination_grace_s", 60)),
        backoff_limit=int(launcher.get("backoff_limit", 3)))


def check_grace(conf: Mapping[str, Any]) -> None:
    """Kubernetes' grace period must hold the checkpoint on stop and the driver's summary after it."""
    grace = int(conf["launcher"].get("termination_grace_s", 60))
    _, save_s = stops.of(conf.get("checkpoint"))
    need = int(save_s + stops.DRIVER_MARGIN_S + FINISH_MARGIN_S + 0.999)
    if grace < need:
        raise PlanError("launcher.termination_grace_s", grace,
                        f"is shorter than the stop needs: checkpoint.stop_grace_s={save_s:g} to save, then the"
                        " driver's summary; Kubernetes SIGKILLs the pod after it",
                        f"use launcher.termination_grace_s={need} or more (or lower checkpoint.stop_grace_s)")


def write_manifests(job: Job) -> int:
    """``launcher.role=manifest``: write the job's manifests and say how to submit them; nothing else is made."""
    overrides, sweep = _hydra_overrides()
    if sweep:
        raise PlanError("launcher", "kubernetes", "writes one job's manifests, not a sweep's",
                        "run ddp-run once per job, each with its own launcher.job_name")
    if job.rd is not None:
        if job.rd.lease is not None:
            job.rd.lease.release()
        raise PlanError("resume", job.conf.get("resume"), "launcher=kubernetes continues its own run directory: a"
                        " restarted pod resumes it", "delete the finished job first (kubectl delete trainjob <name>,"
                        " or pytorchjob <name>), then apply its manifests again (same launcher.job_name)")
    check_grace(job.conf)
    given = {o.split("=", 1)[0].lstrip("+~"): o.split("=", 1)[-1] for o in overrides}
    conf_dir = kube_config.given_dir()
    config_files = kube_config.files(conf_dir) if conf_dir else {}
    args = [*kube_config.pod_prefix(config_files), *pod_args(overrides)]
    env = job.launcher.get("env") or {}
    hidden = kube_checks.secret_names(env, ((job.written or {}).get("launcher") or {}).get("env"))
    secrets.KNOWN.update(str(env[k]) for k in hidden)  # masked wherever the console might show them
    spec = dataclasses.replace(pod_spec(job.conf, job.plan, args, given.get("device"), tuple(hidden)),
                               config_files=config_files)
    folder = kube_checks.manifest_folder(job.launcher, spec.name)
    url = run_url(job.conf, job.plan)
    files = kube_submit.write(folder, spec, [
        f"Written by ddp-run (launcher=kubernetes) for the run directory {url}.",
        "Every pod runs ddp-run with launcher.role=pod; submit the job as ddp-run printed (also in"
        " docs/kubernetes.md)."])
    import shlex

    for line in kube_submit.written_lines(files, spec, conf_dir):
        print(line, flush=True)
    print(f"ddp-run: {spec.nodes} pod(s) × {spec.nproc_per_node} rank(s), each runs: "
          + shlex.join([*spec.command, *args]), flush=True)
    print(f"ddp-run: node 0's pod opens the run directory {url}.", flush=True)
    print("\n".join(kube_submit.submit_lines(files, spec)), flush=True)
    return 0


def _as_node(job: Job) -> Job:
    """This pod's job as ``launcher=multinode`` runs it (the operator's values in its launcher config)."""
    return dataclasses.replace(job, conf={**job.conf, "launcher": pod_launcher(job.launcher)})


class Kubernetes(BaseLauncher):
    """``launcher=kubernetes``: the manifests on the workstation; ``launcher=multinode`` from the operator's
    environment in each pod."""

    name = "kubernetes"

    def check(self, launcher: Mapping[str, Any], output_root: str) -> None:
        """See :func:`check`."""
        check(launcher, output_root)

    def command(self, plan: Plan, launcher: Mapping[str, Any], run_url: str) -> list[str]:
        """In a pod, this node's torchrun; on the workstation, what every pod runs."""
        if role(launcher) == POD:
            return multinode.command(plan, pod_launcher(launcher), run_url)
        conf_dir = kube_config.given_dir()
        prefix = kube_config.pod_prefix(kube_config.files(conf_dir)) if conf_dir else []
        return ["ddp-run", *prefix, *pod_args(_hydra_overrides()[0])]

    def env(self, launcher: Mapping[str, Any]) -> dict[str, str]:
        """A pod's: multinode's (its node name)."""
        return multinode.env(pod_launcher(launcher)) if role(launcher) == POD else {}

    def open(self, job: Job) -> RunDir | None:
        """In node 0's pod, the run directory it opens or continues; None elsewhere (the other pods join it; the
        workstation writes the manifests)."""
        if role(job.launcher) != POD:
            return None
        if job.rd is not None:
            if job.rd.lease is not None:
                job.rd.lease.release()
            raise PlanError("resume", job.conf.get("resume"), "a pod continues its job's run directory by itself",
                            "leave resume out of the job's command line: a restarted pod resumes the run")
        check_nproc(job.plan)
        return multinode.LAUNCHER.open(_as_node(job))

    def join(self, job: Job) -> int:
        """On the workstation, write the manifests; in any pod but node 0's, join the run directory."""
        if role(job.launcher) != POD:
            return write_manifests(job)
        return multinode.LAUNCHER.join(_as_node(job))

    def launch(self, job: Job, rd: RunDir, manifest: dict[str, Any]) -> int:
        """Node 0's pod: as node 0 of a multi-node run."""
        return multinode.LAUNCHER.launch(_as_node(job), rd, manifest)


LAUNCHER = Kubernetes()

