"""One job: plan, refuse or launch through the job's launcher, and say how it ended.

The flow, one direction: the composed config (or a continued run's own) → :func:`~ddp_runner.job.planning.plan_job`
→ dry run, or the launcher opens (or joins) the run directory → config.yaml and run.json recorded → the launcher
launches and supervises → exit code.
"""

from __future__ import annotations

import os
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from omegaconf import OmegaConf

from ddp_runner.config import memory_plan
from ddp_runner.config.diagnostic_keys import without_fault
from ddp_runner.config.plan import Plan
from ddp_runner.contract import layout, tracking
from ddp_runner.contract.errors import PlanError
from ddp_runner.data import prep as data_prep
from ddp_runner.diagnostics.doctor import cheap_report
from ddp_runner.job.planning import memory, plan_job
from ddp_runner.launch import registry
from ddp_runner.launch.base import Job
from ddp_runner.rundir import resume as resume_checks
from ddp_runner.rundir import run_dir as rundir
from ddp_runner.rundir.lease import take_or_refuse
from ddp_runner.rundir.manifest import initial_manifest
from ddp_runner.trackers import preflight as tracker_checks
from ddp_runner.trackers import runs as tracker_runs


@dataclass
class Invocation:
    """How the job was asked for (from Hydra's record of it), so that it can be reproduced, and where a new run
    directory goes (a sweep's jobs go into the sweep's directory)."""

    argv: list[str]
    overrides: list[str] = field(default_factory=list)
    task_preset: str | None = None
    config_name: str | None = None
    config_sources: list[str] = field(default_factory=list)
    swept: dict[str, str] = field(default_factory=dict)
    new_run_dir: Callable[[dict[str, Any], Plan, datetime], rundir.RunDir] | None = None
    paths_given: dict[str, str] = field(default_factory=dict)  # data paths as typed, before made absolute

    def record(self, task_dir: str | None) -> dict[str, Any]:
        """``invocation`` in run.json."""
        return {"argv": self.argv, "cwd": os.getcwd(), "overrides": self.overrides, "task_preset": self.task_preset,
                "paths_given": self.paths_given,
                "config_name": self.config_name, "config_sources": self.config_sources, "task_dir": task_dir,
                # This job's value of each key the sweep varies (TensorBoard's HPARAMS table shows them).
                "swept": self.swept}


@dataclass
class Outcome:
    """How a job ended: its exit code, its run directory (None when it got none) and a refusal's reason."""

    code: int
    run_dir: str | None = None
    reason: str | None = None

    @property
    def refused(self) -> bool:
        """Was the job refused before anything started?"""
        return self.code == layout.EXIT_REFUSED and self.run_dir is None


def refuse(err: PlanError) -> Outcome:
    """Print a refusal the user can act on; the refused outcome."""
    print(f"ddp-run: refused: {err.key}={err.value!r}: {err.problem}.\n"
          f"  key:   {err.key}\n  value: {err.value!r}\n  fix:   {err.fix}\n"
          "Nothing was started and no run directory was created.", file=sys.stderr)
    return Outcome(layout.EXIT_REFUSED, reason=f"refused: {err.key}={err.value!r}: {err.problem}")


def absolute_paths(conf: dict[str, Any]) -> dict[str, str]:
    """Make the local relative data paths of ``conf`` absolute (in place), so that the run resumes and reproduces
    from any directory; returns the spellings as given, by key."""
    given = {}
    data = conf.get("data") or {}
    for key in ("path", "val_path"):
        value = data.get(key)
        if isinstance(value, str) and value and "://" not in value and not os.path.isabs(value):
            given[f"data.{key}"] = value
            data[key] = os.path.abspath(os.path.expanduser(value))
    return given


def new_run_dir(conf: dict[str, Any], plan: Plan, started: datetime) -> rundir.RunDir:
    """A single run's directory: ``<root>/<date>/<time>_<task>_w<ws>``."""
    return rundir.create_run_dir(conf["output"]["root"], conf["task"]["name"], plan.world_size, started)


# What a continued run takes from the command line; everything else is its own config.yaml.
CONTINUE_KEYS = ("resume", "output.root", "dry_run", "train.max_steps")


def _int_or_refuse(key: str, value: str) -> int:
    if not value.isdigit() or int(value) <= 0:
        raise PlanError(key, value, "must be a positive number of optimizer steps", f"e.g. {key}=1000")
    return int(value)


def _continued_run(resume: str, dry_run: bool, overrides: list[str]) -> tuple[dict[str, Any], rundir.RunDir]:
    """``resume=<run dir>``: that run's own config, and the directory, its lease taken (held until this driver
    exits). Workers take the run's own newest checkpoint first and fall back to where the run started from."""
    rd = rundir.open_run_dir(resume)
    with rd.fs.open(layout.join(rd.path, layout.CONFIG)) as f:
        conf = OmegaConf.to_container(OmegaConf.create(f.read().decode()), resolve=True)
    conf["dry_run"] = dry_run
    if without_fault(conf):  # a rehearsal fault strikes once, not again in the continued run
        print("ddp-run: note: the run's fault.* is not repeated when it is continued", file=sys.stderr)
    keys = {o.split("=", 1)[0].lstrip("+~"): o.split("=", 1)[-1] for o in overrides}
    ignored = [o for o in overrides if o.split("=", 1)[0].lstrip("+~") not in CONTINUE_KEYS]
    if ignored:
        print(f"ddp-run: warning: continuing {rd.url} with its own config.yaml; ignored: {' '.join(ignored)}",
              file=sys.stderr, flush=True)
    previous = rd.read_json(layout.MANIFEST)
    resume_checks.check_no_live_driver(rd.url, previous)
    max_steps = _int_or_refuse("train.max_steps", keys["train.max_steps"]) if "train.max_steps" in keys else None
    resume_checks.check_continuable(rd.url, previous, conf, max_steps)  # before the lease: a refusal changes nothing
    if max_steps is not None:
        conf["train"]["max_steps"] = max_steps
    rd.lease = take_or_refuse(rd.fs, rd.path, rd.url)
    rd.continued = True
    return conf, rd


def _planned(conf: dict[str, Any], rd: rundir.RunDir | None) -> tuple[Plan, str | None, Any, dict | None]:
    """Plan the job (PlanError on refusal): its plan, task directory, probe and memory plan."""
    recorded = rd.read_json(layout.MANIFEST).get("invocation", {}).get("task_dir") if rd is not None else None
    plan, task_dir, probe = plan_job(conf, [recorded] if recorded else [])
    resume = str(conf.get("resume", "auto"))
    try:
        if rd is None and resume not in resume_checks.NEW_RUN:
            resume_checks.check_resume_source(resume, plan)
    except BaseException:
        if probe is not None:
            probe.cancel()
        raise
    return plan, task_dir, probe, memory(conf, plan, probe)


def _announce(conf: dict[str, Any], plan: Plan, mem: dict[str, Any] | None) -> None:
    print(f"ddp-run: {conf['task']['name']}: {plan.explanation}; device {plan.device}, backend {plan.backend}",
          flush=True)
    if mem is not None:
        print(f"ddp-run: {memory_plan.describe(mem)}", flush=True)
        if (tight := memory_plan.tight(mem)) is not None:
            print(f"ddp-run: warning: {tight}", file=sys.stderr, flush=True)


def _record_start(job: Job, rd: rundir.RunDir, cmd: list[str], how: Invocation, started: datetime,
                  mem: dict[str, Any] | None, trackers: dict[str, Any]) -> dict[str, Any]:
    """config.yaml (what the workers run) and run.json (the manifest) into the opened run directory."""
    conf, plan = job.conf, job.plan
    rd.write_text(layout.CONFIG, OmegaConf.to_yaml(OmegaConf.create(conf)))
    manifest = initial_manifest(plan, cmd, conf["task"]["name"], started, invocation=how.record(job.task_dir),
                                data=data_prep.describe(conf["data"]))
    manifest["doctor"] = cheap_report(gpu=plan.device == "cuda")  # the preflight checks that cost no time
    manifest[layout.MANIFEST_MEMORY_PLAN] = mem
    manifest[tracking.MANIFEST_TRACKERS] = trackers
    if rd.continued:
        previous = rd.read_json(layout.MANIFEST)
        manifest["started"] = previous.get("started", manifest["started"])
        manifest["continued"] = previous.get("continued", []) + [started.isoformat(timespec="seconds")]
    rd.write_json(layout.MANIFEST, manifest)
    print(f"ddp-run: run directory {rd.url}", flush=True)
    return manifest


_RUN_DIR = "$RUN_DIR"  # the dry run's stand-in for the run directory, which only a launch creates


def launch_argv(argv: list[str]) -> list[str]:
    """The dry run's command line without ``dry_run=true``: what launches the plan it printed."""
    return [a for a in argv if a.lstrip("+").split("=", 1)[0] != "dry_run"]


def _shell_word(word: str) -> str:
    """``word`` for a POSIX shell, with ``$RUN_DIR`` left for the shell to expand (and nothing else)."""
    if _RUN_DIR not in word:
        return shlex.quote(word)
    escaped = word.replace("\\", "\\\\").replace('"', '\\"').replace("`", "\\`").replace("$", "\\$")
    return '"' + escaped.replace("\\" + _RUN_DIR, _RUN_DIR) + '"'


def _print_dry_run(how: Invocation, cmd: list[str], launcher: str) -> None:
    """What to type to launch this plan (a sweep: the whole sweep), and exactly what ddp-run then starts."""
    what = "this sweep" if {"-m", "--multirun"} & set(how.argv) else "this plan"
    starts = ("submits an sbatch job (RUN_DIR/slurm/job.sbatch) whose nodes run" if launcher == "slurm"
              else "starts")
    print(f"ddp-run: dry run, nothing launched. To launch {what}, run:\n  " + shlex.join(launch_argv(how.argv))
          + "\nddp-run then creates the run directory (RUN_DIR below), writes config.yaml and run.json into it, and "
          f"{starts}:\n  " + " ".join(_shell_word(a) for a in cmd), flush=True)


def execute(composed: dict[str, Any], how: Invocation,
            check: Callable[[dict[str, Any]], None] | None = None) -> Outcome:
    """One job: plan, refuse or launch, supervise, summarise. ``check``: refuses (PlanError) a composed config the
    command line broke (e.g. a required key removed); a continued run's own config is not checked by it."""
    t0, started = time.time(), datetime.now()
    resume = str(composed.get("resume", "auto"))
    rd = None
    try:
        conf = composed
        if resume == resume_checks.LAST:
            resume = resume_checks.latest_unfinished(str(composed["output"]["root"]))
            print(f"ddp-run: resume=last: continuing {resume}", flush=True)
        if resume not in resume_checks.NEW_RUN and resume_checks.is_run_dir(resume):
            conf, rd = _continued_run(resume, bool(composed.get("dry_run")), how.overrides)
        else:
            how.paths_given = absolute_paths(conf)
            if check is not None:
                check(conf)
        plan, task_dir, probe, mem = _planned(conf, rd)
        tracker_checks.check_installed(conf)
        if not conf["dry_run"]:  # before anything is created: a tracker that cannot be reached refuses the launch
            tracker_checks.preflight(conf)
    except PlanError as err:
        if rd is not None and rd.lease is not None:  # refused after taking the lease: give it back now
            rd.lease.release()
        return refuse(err)
    _announce(conf, plan, mem)
    launcher = registry.get(conf["launcher"])
    if conf["dry_run"]:
        _print_dry_run(how, launcher.command(plan, conf["launcher"], _RUN_DIR), conf["launcher"]["name"])
        print(OmegaConf.to_yaml(OmegaConf.create({"plan": plan.to_manifest(), layout.MANIFEST_MEMORY_PLAN: mem})))
        if rd is not None and rd.lease is not None:
            rd.lease.release()
        return Outcome(0)
    if conf["output"].get("private"):
        # Everything this driver, torchrun and the workers create from here on (they inherit the umask) is
        # owner-only: the run directory, logs, TensorBoard files, checkpoints.
        os.umask(0o077)
    _say_where_it_starts(conf, rd, how)
    make = how.new_run_dir or new_run_dir
    job = Job(conf, plan, t0, task_dir, rd=rd, new_run_dir=lambda: make(conf, plan, started))
    return _launch(job, launcher, how, started, mem, probe)


def _say_where_it_starts(conf: dict[str, Any], rd: rundir.RunDir | None, how: Invocation) -> None:
    """A new run from step 0 says so where that may surprise: asked to restart, or an unfinished run exists."""
    resume = str(conf.get("resume", "auto"))
    if rd is not None or how.new_run_dir is not None:  # continued in place (the workers say from where), a sweep job
        return
    if resume == "restart":
        print("ddp-run: resume=restart: a new run from step 0", flush=True)
    elif resume == "auto" and (note := resume_checks.note_unfinished(str(conf["output"]["root"]))):
        print(note, file=sys.stderr, flush=True)


def _launch(job: Job, launcher: Any, how: Invocation, started: datetime, mem: dict[str, Any] | None,
            probe: Any) -> Outcome:
    """Open (or join) the run directory through the launcher, record the start, launch."""
    try:
        rd = launcher.open(job)
        if rd is None:  # another node of a multi-node run: node 0's driver opens the run directory
            return Outcome(launcher.join(job))
    except PlanError as err:
        return refuse(err)
    try:
        trackers = _open_trackers(job, rd, how)
    except PlanError as err:
        if rd.continued:
            if rd.lease is not None:
                rd.lease.release()
        else:
            rd.remove()  # no half-made run directory
        return refuse(err)
    if rd.continued:
        job.staged = rundir.prepare_continue(rd)
    if probe is not None:
        probe.keep()  # the next job with this task and model skips the probe
    cmd = launcher.command(job.plan, job.launcher, rd.url)
    manifest = _record_start(job, rd, cmd, how, started, mem, trackers)
    try:
        return Outcome(launcher.launch(job, rd, manifest), run_dir=rd.url)
    except PlanError as err:  # refused by the launcher at launch (sbatch): it left no run directory
        return refuse(err)
    finally:
        _close_trackers(job.conf, rd, trackers)


def _open_trackers(job: Job, rd: rundir.RunDir, how: Invocation) -> dict[str, Any]:
    """This job's tracker runs (a continued run's own again), for run.json's ``trackers``."""
    previous = rd.read_json(layout.MANIFEST).get(tracking.MANIFEST_TRACKERS) if rd.continued else None
    sweep_dir = rd.url.rstrip("/").rsplit("/", 1)[0] if how.new_run_dir is not None else None
    return tracker_runs.open_runs(job.conf, tracker_runs.plan_params(job.plan), rd.url, sweep_dir, previous)


def _close_trackers(conf: dict[str, Any], rd: rundir.RunDir, trackers: dict[str, Any]) -> None:
    """Tell the trackers how the job ended (run.json's status)."""
    if tracking.MLFLOW not in trackers:
        return
    try:
        status = rd.read_json(layout.MANIFEST).get("status")
    except (OSError, ValueError):
        status = None
    if (warning := tracker_runs.finish(conf, trackers, status)) is not None:
        print(f"ddp-run: warning: {warning}", file=sys.stderr, flush=True)
