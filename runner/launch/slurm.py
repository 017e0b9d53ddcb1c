"""launcher=slurm: an sbatch script the runner writes, submitted with ``sbatch``, and the job's own driver.

Why a script and not submitit: the script is a plain file a reviewer reads in the run directory
(``slurm/job.sbatch``) and a user can resubmit by hand; Slurm requeues and preempts it as any batch job, and the
same script then continues the same run directory. submitit would pickle a Python callable instead and add a
dependency for what is ``sbatch`` plus one ``srun``.

Three parts:

- the **submitting driver** (``ddp-run launcher=slurm …``, on a login node) plans the run, creates the run
  directory (status ``queued``), writes the script and submits it; with ``launcher.wait=true`` it then follows the
  job like a local run (console, outcome, exit code), and Ctrl-C cancels the job;
- the **job's driver** (``python -m ddp_runner.launch.slurm <run dir>``, the batch step on the job's first node)
  marks the run running, starts one ``srun`` task per node, each a torchrun agent with a c10d rendezvous on the
  first node, supervises it and writes run.json and summary.json as a local driver does. A requeued job
  (preemption, ``scontrol requeue``) continues the same run directory from its newest checkpoint;
- the **agents and workers**, as for every launcher.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import fsspec

from ddp_runner.config.plan import Gpu, Plan
from ddp_runner.contract import command_line, layout, stops
from ddp_runner.contract.errors import PlanError
from ddp_runner.contract.osutil import handle_signals, restore_signals
from ddp_runner.launch.base import BaseLauncher, Job
from ddp_runner.launch.local import agent_prefix, worker_tail
from ddp_runner.rundir.run_dir import RunDir

POLL_S = 1.0
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY", "BOOT_FAIL",
         "DEADLINE")
# After Slurm says the job ended, how long the follower waits for the job's driver to finish summary.json.
FINALIZE_GRACE_S = 30.0


def check(launcher: Mapping[str, Any], output_root: str | None = None) -> None:
    """Refuse a Slurm launcher config sbatch would reject, or one whose other nodes could not write their ranks'
    files (a remote ``output_root``: the job's driver stages them in a folder on its own node only)."""
    nodes = launcher.get("nodes")
    if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes <= 0:
        raise PlanError("launcher.nodes", nodes, "must be a positive number of nodes", "e.g. launcher.nodes=2")
    protocol = fsspec.core.split_protocol(str(output_root or ""))[0]
    if nodes > 1 and protocol not in (None, "file", "local"):
        raise PlanError("output.root", output_root,
                        f"is not a filesystem the {nodes} nodes mount: the job's ranks write their logs into a"
                        " staging folder that exists on its first node only",
                        "put output.root on a filesystem every node mounts (e.g. /shared/runs), or use"
                        " launcher=multinode, whose every node copies its ranks' files to the bucket")
    extra = launcher.get("sbatch") or []
    if not isinstance(extra, list) or not all(isinstance(o, str) and o.startswith("--") for o in extra):
        raise PlanError("launcher.sbatch", extra, "must be a list of sbatch options, each starting with --",
                        "e.g. 'launcher.sbatch=[--qos=high,--constraint=a100]'")
    before = launcher.get("signal_before_s", 120)
    if isinstance(before, bool) or not isinstance(before, int) or before <= 0:
        raise PlanError("launcher.signal_before_s", before, "must be a positive number of seconds",
                        "e.g. 120: time for a checkpoint before Slurm's time limit")
    port = launcher.get("rdzv_port")
    if isinstance(port, bool) or not isinstance(port, int) or not 1024 <= port <= 64535:
        raise PlanError("launcher.rdzv_port", port, "must be a port from 1024 to 64535", "e.g. 29500")


def rdzv_port(launcher: Mapping[str, Any], job_id: str) -> int:
    """The job's rendezvous port: two jobs sharing a first node do not collide."""
    return int(launcher.get("rdzv_port", 29500)) + (int(job_id) % 1000 if job_id.isdigit() else 0)


def command(plan: Plan, launcher: Mapping[str, Any], run_url: str, head: str = "$HEAD",
            job_id: str = "$SLURM_JOB_ID", local_dir: str | None = None) -> list[str]:
    """The srun command the job's driver runs: one task per node, each a torchrun agent (rendezvous on ``head``)."""
    nodes = int(launcher.get("nodes", 1))
    port = rdzv_port(launcher, job_id) if job_id.isdigit() else f"{launcher.get('rdzv_port', 29500)}+id%1000"
    logs = os.path.join(local_dir or run_url, layout.LOGS)
    return ["srun", f"--nodes={nodes}", f"--ntasks={nodes}", "--ntasks-per-node=1", "--kill-on-bad-exit=1",
            # each node's agent log; %n: the node's index in the job
            f"--error={logs}/torchrun.node%n.log",
            *agent_prefix(), f"--nnodes={nodes}", f"--nproc-per-node={plan.nproc_per_node}",
            "--rdzv-backend=c10d", f"--rdzv-endpoint={head}:{port}", f"--rdzv-id=slurm-{job_id}",
            f"--max-restarts={launcher.get('max_restarts', 0)}", *worker_tail(run_url)]


def script(run_url: str, local_dir: str, launcher: Mapping[str, Any], job_name: str,
           stop_signal: int | None = None) -> str:
    """The batch script: resources, then the job's driver (``python -m ddp_runner.launch.slurm <run dir>``).

    ``stop_signal`` (``checkpoint.stop_signal``): Slurm sends it to the job's driver (the batch shell, which
    ``exec``s it) ``launcher.signal_before_s`` before the time limit; the ranks save a checkpoint, the run ends
    ``preempted`` and, with ``launcher.requeue``, the job requeues itself and continues the same run directory.
    """
    sig = stops.signal_name(stop_signal or signal.SIGTERM).removeprefix("SIG")
    opts = [f"--job-name={job_name}", f"--nodes={launcher.get('nodes', 1)}", "--ntasks-per-node=1",
            f"--output={os.path.join(local_dir, layout.SLURM_LOG)}", "--open-mode=append",
            "--requeue" if launcher.get("requeue", True) else "--no-requeue",
            f"--signal=B:{sig}@{int(launcher.get('signal_before_s') or 120)}"]
    for key, flag in (("gpus_per_node", "gpus-per-node"), ("cpus_per_task", "cpus-per-task"),
                      ("partition", "partition"), ("time", "time"), ("account", "account")):
        if launcher.get(key) not in (None, ""):
            opts.append(f"--{flag}={launcher[key]}")
    opts += list(launcher.get("sbatch") or [])
    lines = ["#!/bin/bash", "# Written by ddp-run (launcher=slurm). Resubmit by hand with: sbatch <this file>",
             *(f"#SBATCH {o}" for o in opts), "",
             f"cd {shlex.quote(os.getcwd())}",
             f"exec {shlex.quote(sys.executable)} -m ddp_runner.launch.slurm {shlex.quote(run_url)}", ""]
    return "\n".join(lines)


def submit(rd: RunDir, manifest: dict[str, Any], launcher: Mapping[str, Any], task: str,
           stop_signal: int | None = None) -> str:
    """Write the script into the run directory, submit it and record the job id; returns the job id."""
    if shutil.which("sbatch") is None:
        raise PlanError("launcher", "slurm", "sbatch is not on this host's PATH",
                        "run ddp-run on a Slurm login node, or use launcher=local / launcher=multinode")
    text = script(rd.url, rd.local, launcher, f"ddp-{task}", stop_signal)
    Path(rd.local, layout.SLURM_LOG).parent.mkdir(parents=True, exist_ok=True)
    rd.fs.makedirs(layout.join(rd.path, layout.SLURM_SCRIPT.rsplit("/", 1)[0]), exist_ok=True)
    rd.write_text(layout.SLURM_SCRIPT, text)
    path = os.path.join(rd.local, layout.SLURM_SCRIPT)
    if rd.is_remote:  # sbatch reads a local file
        Path(path).write_text(text)
    r = subprocess.run(["sbatch", "--parsable", path], capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise PlanError("launcher", "slurm", f"sbatch refused the job: {r.stderr.strip()[:400]}",
                        f"check launcher.partition, launcher.account, launcher.time and launcher.sbatch in {path}")
    job_id = r.stdout.strip().split(";", 1)[0]
    job = {"job_id": job_id, "submitted": datetime.now().isoformat(timespec="seconds"),
           "script": layout.SLURM_SCRIPT, "output": layout.SLURM_LOG.replace("%j", job_id)}
    rd.write_json(layout.SLURM_JOB, job)
    manifest.update(status=layout.STATUS_QUEUED, slurm=job)
    rd.write_json(layout.MANIFEST, manifest)
    return job_id


def job_state(job_id: str) -> dict[str, str]:
    """``scontrol show job``'s fields for the job ({} once Slurm has forgotten it)."""
    r = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        return {}
    return dict(f.split("=", 1) for f in r.stdout.split() if "=" in f)


class _Tail:
    """Prints the job's console output (its ``slurm/job-<id>.out``) as it grows."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset = path, 0

    def pump(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return
        self.offset += len(data)
        sys.stdout.write(data.decode(errors="replace"))
        sys.stdout.flush()


def follow(rd: RunDir, job_id: str) -> int:
    """Follow a submitted job to its end like a local run; Ctrl-C (or SIGTERM) cancels it. Returns the exit code."""
    cancelled: list[int] = []

    def on_signal(signum: int, _frame: Any) -> None:
        if not cancelled:
            print(f"ddp-run: cancelling Slurm job {job_id} (signal {signum}); its ranks stop and the run directory"
                  " records it", file=sys.stderr, flush=True)
            subprocess.run(["scancel", "--full", job_id], timeout=60, check=False)
        cancelled.append(signum)

    old = handle_signals((signal.SIGINT, signal.SIGTERM), on_signal)
    tail = _Tail(Path(rd.local, layout.SLURM_LOG.replace("%j", job_id)))
    last = None
    try:
        while True:
            info = job_state(job_id)
            state = info.get("JobState")
            if state != last and state:
                where = f" on {info.get('NodeList')}" if state == "RUNNING" else ""
                print(f"ddp-run: Slurm job {job_id} {state}{where}", flush=True)
                last = state
            tail.pump()
            if not info or state in ENDED:
                break
            time.sleep(POLL_S)
    finally:
        restore_signals(old)
    manifest = await_final(rd, state or "unknown")
    tail.pump()
    status = manifest.get("status")
    if status == layout.STATUS_COMPLETED:
        return 0
    if cancelled:
        return 128 + cancelled[0]
    return 1


def await_final(rd: RunDir, state: str) -> dict[str, Any]:
    """run.json once the job's driver has finalised it; a job that ended without doing so (cancelled while
    queued, killed) is recorded as such, so that the run directory tells the truth."""
    deadline = time.monotonic() + FINALIZE_GRACE_S
    while True:
        manifest = rd.read_json(layout.MANIFEST)
        if manifest.get("status") not in (layout.STATUS_QUEUED, layout.STATUS_RUNNING):
            return manifest
        if time.monotonic() > deadline:
            break
        time.sleep(POLL_S)
    started = manifest.get("status") == layout.STATUS_RUNNING
    status = layout.STATUS_INTERRUPTED if state in ("CANCELLED", "PREEMPTED") else layout.STATUS_FAILED
    reason = (f"Slurm job ended {state} " + ("before its driver recorded the outcome" if started
                                             else "before it started"))
    manifest.update(status=status, ended=datetime.now().isoformat(timespec="seconds"), slurm_state=state)
    rd.write_json(layout.MANIFEST, manifest)
    rd.write_json(layout.SUMMARY, {"status": status, "root_cause": {"rank": None, "type": "SlurmJob",
                                                                    "message": reason}})
    print(f"ddp-run: {status.upper()}: {reason}", file=sys.stderr, flush=True)
    return manifest


def _plan_of(manifest: Mapping[str, Any]) -> Plan:
    p = dict(manifest["plan"])
    p.pop("explanation", None)
    p["gpus"] = tuple(Gpu(**g) for g in p.get("gpus", []))
    return Plan(**p)


def _job_nodes() -> list[str]:
    """The job's node names, first node first."""
    nodelist = os.environ.get("SLURM_JOB_NODELIST", "")
    r = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=60)
    return r.stdout.split() or [os.environ.get("SLURMD_NODENAME", "localhost")]


def _node_addr(node: str) -> str:
    """The address Slurm reaches ``node`` at (its NodeAddr: the other nodes reach the rendezvous there)."""
    r = subprocess.run(["scontrol", "show", "node", "-o", node], capture_output=True, text=True, timeout=60)
    fields = dict(f.split("=", 1) for f in r.stdout.split() if "=" in f)
    return fields.get("NodeAddr") or node


def job_main(run_url: str) -> int:
    """The job's driver (the batch step): run every node's agent through srun into ``run_url``, then finalise."""
    from omegaconf import OmegaConf

    from ddp_runner.launch.multinode_rdzv import env as multinode_env
    from ddp_runner.rundir import run_dir as rundir
    from ddp_runner.rundir.status import this_driver
    from ddp_runner.supervise import finalize
    from ddp_runner.supervise.session import Session, environment

    t0 = time.time()
    rd = rundir.open_run_dir(run_url)
    with rd.fs.open(layout.join(rd.path, layout.CONFIG)) as f:
        conf = OmegaConf.to_container(OmegaConf.create(f.read().decode()), resolve=True)
    launcher = conf["launcher"]
    manifest = rd.read_json(layout.MANIFEST)
    restarts = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
    if restarts or manifest.get("status") not in (layout.STATUS_QUEUED, layout.STATUS_RUNNING):
        # A requeued (or preempted) job: the same run directory, resumed from its newest checkpoint.
        rundir.prepare_continue(rd)
        manifest["continued"] = manifest.get("continued", []) + [datetime.now().isoformat(timespec="seconds")]
        print(f"ddp-run: Slurm job {os.environ.get('SLURM_JOB_ID')} restart {restarts}: continuing {rd.url}",
              flush=True)
    elif rd.is_remote:
        rd.local = rundir.staging_dir(rd.path)
    plan = _plan_of(manifest)
    job_id = os.environ.get("SLURM_JOB_ID", "")
    hosts = _job_nodes()
    head = _node_addr(hosts[0])
    cmd = command(plan, launcher, rd.url, head=head, job_id=job_id, local_dir=rd.local)
    for key in ("status", "ended", "exit_codes", "torchrun_exit_code", "finalize_error"):
        manifest.pop(key, None)
    manifest.update(status=layout.STATUS_RUNNING, driver=this_driver(), command=cmd,
                    slurm={**manifest.get("slurm", {}), "job_id": job_id, "restarts": restarts,
                           "nodes": hosts, "partition": os.environ.get("SLURM_JOB_PARTITION")})
    rd.write_json(layout.MANIFEST, manifest)
    extra = multinode_env({"rdzv_endpoint": f"{head}:0"})
    extra.pop(layout.ENV_NODE, None)  # each node's workers take SLURM_NODEID
    task_dir = manifest.get("invocation", {}).get("task_dir")
    print(f"ddp-run: Slurm job {job_id} on {', '.join(hosts)}: rendezvous {head}:{rdzv_port(launcher, job_id)}",
          flush=True)
    session = Session(rd, conf, plan, cmd, environment(rd, conf, plan, t0, task_dir, extra), manifest=manifest,
                      stop_by_file=True)
    rc = session.run()
    code = finalize.finish(rd, manifest, plan, rc, session.interrupted, watch=session.observations(),
                                preempt=session.preempt)
    session.close()
    if manifest.get("status") == layout.STATUS_PREEMPTED and launcher.get("requeue", True):
        requeue(job_id, rd.url)
    print(rd.url, flush=True)
    return code


def requeue(job_id: str, run_url: str) -> None:
    """A pre-empted run (its checkpoint committed): requeue this job, which then continues ``run_url``."""
    r = subprocess.run(["scontrol", "requeue", job_id], capture_output=True, text=True, timeout=60)
    if r.returncode == 0:
        print(f"ddp-run: preempted: requeued Slurm job {job_id}; it continues {run_url} from its checkpoint",
              flush=True)
    else:
        print(f"ddp-run: preempted, but scontrol requeue {job_id} failed ({r.stderr.strip()[:200]}); continue"
              f" with: {command_line.resume(run_url)}", file=sys.stderr, flush=True)


def submit_and_follow(rd: RunDir, manifest: dict[str, Any], launcher: Mapping[str, Any], task: str,
                      stop_signal: int | None = None) -> int:
    """The submitting driver's part: submit, then follow (``launcher.wait``) or print the job id and return."""
    job_id = submit(rd, manifest, launcher, task, stop_signal)
    print(f"ddp-run: submitted Slurm job {job_id}; script {layout.join(rd.url, layout.SLURM_SCRIPT)}", flush=True)
    if not launcher.get("wait", True):
        print(f"ddp-run: not waiting (launcher.wait=false): follow it with squeue -j {job_id}; outcome in"
              f" {layout.join(rd.url, layout.SUMMARY)}", flush=True)
        print(rd.url, flush=True)
        return 0
    code = follow(rd, job_id)
    print(rd.url, flush=True)
    return code


class Slurm(BaseLauncher):
    """``launcher=slurm``: this driver writes the run directory and submits; the job's own driver (the batch
    step, :func:`job_main`) runs torchrun on the job's nodes under the same supervision session."""

    name = "slurm"

    def check(self, launcher: Mapping[str, Any], output_root: str) -> None:
        """See :func:`check`."""
        check(launcher, output_root)

    def command(self, plan: Plan, launcher: Mapping[str, Any], run_url: str) -> list[str]:
        """See :func:`command`."""
        return command(plan, launcher, run_url)

    def launch(self, job: Job, rd: RunDir, manifest: dict[str, Any]) -> int:
        """Submit, then follow; a refusal by sbatch leaves no run directory behind. A job of a sweep that waits
        (``job.submitted`` is its list) is only submitted: the sweep follows all its jobs together."""
        try:
            if job.submitted is not None and job.launcher.get("wait", True):
                job_id = submit(rd, manifest, job.launcher, job.conf["task"]["name"],
                                stops.of(job.conf.get("checkpoint"))[0])
                print(f"ddp-run: submitted Slurm job {job_id}; script {layout.join(rd.url, layout.SLURM_SCRIPT)}",
                      flush=True)
                job.submitted.append((rd, job_id))
                return 0
            return submit_and_follow(rd, manifest, job.launcher, job.conf["task"]["name"],
                                     stops.of(job.conf.get("checkpoint"))[0])
        except PlanError:
            rd.remove()
            raise


LAUNCHER = Slurm()


if __name__ == "__main__":
    sys.exit(job_main(sys.argv[1]))
