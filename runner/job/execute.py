"""One job: plan, refuse or launch through the job's launcher, and say how it ended.

The flow, one direction: the composed config (or a continued run's own, ``continued.py``) →
:func:`~ddp_runner.job.planning.plan_job` → dry run, or the launch (``launching.py``): the launcher opens (or joins)
the run directory → config.yaml and run.json recorded → the launcher launches and supervises → exit code.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from omegaconf import OmegaConf

from ddp_runner.config import memory_plan
from ddp_runner.config.plan import Plan
from ddp_runner.console import sweep_view, textfit
from ddp_runner.contract import layout, secrets
from ddp_runner.contract.errors import PlanError
from ddp_runner.job import dry_run
from ddp_runner.job.continued import continued_run
from ddp_runner.job.invocation import Invocation, Outcome, refuse, sweep_job
from ddp_runner.job.launching import launch, on_disk
from ddp_runner.job.planning import memory, plan_job
from ddp_runner.launch import registry
from ddp_runner.launch.base import Job
from ddp_runner.rundir import records, resume_last
from ddp_runner.rundir import resume as resume_checks
from ddp_runner.rundir import run_dir as rundir
from ddp_runner.trackers import preflight as tracker_checks

# The names a caller of one job uses (the CLI, the tests): the job's record and outcome are in invocation.py.
__all__ = ["Invocation", "Outcome", "absolute_paths", "execute", "new_run_dir", "refuse"]


def execute(composed: dict[str, Any], how: Invocation,
            check: Callable[[dict[str, Any]], None] | None = None) -> Outcome:
    """One job: plan, refuse or launch, supervise, summarise. ``check``: refuses (PlanError) a composed config the
    command line broke (e.g. a required key removed); a continued run's own config is not checked by it."""
    t0, started = time.time(), datetime.now()
    rd = None
    try:
        conf, rd = _job_config(composed, how, check)
        _keep_secrets(conf, how)  # before planning: a refusal's message is masked too
        plan, task_dir, probe, mem = _plan(conf, rd, how)
        _check_trackers(conf)
    except PlanError as err:
        if rd is not None and rd.lease is not None:  # refused after taking the lease: give it back now
            rd.lease.release()
        return refuse(err, sweep_job(how))
    _keep_secrets(conf, how)
    _announce(conf, plan, mem, quiet=sweep_view.in_turn(how.new_run_dir is not None, conf))
    _say_resume_changes(how)
    launcher = registry.get(conf["launcher"])
    if conf["dry_run"]:
        return _dry_run(conf, plan, mem, launcher, task_dir, rd, how)
    _before_launch(conf, rd, how)
    make = how.new_run_dir or new_run_dir
    job = Job(conf, plan, t0, task_dir, rd=rd, new_run_dir=lambda: make(conf, plan, started),
              submitted=how.submitted, written=on_disk(conf, how.env_raw))
    return launch(job, launcher, how, started, mem, probe)


def _job_config(composed: dict[str, Any], how: Invocation, check: Callable[[dict[str, Any]], None] | None,
                ) -> tuple[dict[str, Any], rundir.RunDir | None]:
    """The config the job runs, and the run directory it continues (its lease taken) or None for a new run.

    ``resume=last`` chooses the run first; ``resume=<run dir>`` continues it with its own config.yaml; otherwise the
    composed config, its local data paths made absolute, checked by ``check``."""
    resume = str(composed.get("resume", "auto"))
    chose: list[str] = []  # the overrides that chose the run resume=last continues
    if resume == resume_checks.LAST:
        resume, chose = _choose_last(composed, how)
    if resume not in resume_checks.NEW_RUN:  # what the workers will pass over, said before launch
        for note in resume_checks.skipped_notes(resume):
            textfit.say(f"ddp-run: note: {note}", sys.stderr, flush=True)
    if resume not in resume_checks.NEW_RUN and resume_checks.is_run_dir(resume):
        conf, rd, how.env_raw, how.resume_changes = continued_run(resume, bool(composed.get("dry_run")),
                                                                  how.overrides, composed, chose)
        return conf, rd
    how.paths_given = absolute_paths(composed)
    if check is not None:
        check(composed)
    return composed, None


def _choose_last(composed: dict[str, Any], how: Invocation) -> tuple[str, list[str]]:
    """``resume=last``: the run it continues, and the overrides that chose it (said on the console)."""
    resume, want = resume_last.choose(str(composed["output"]["root"]), composed, how.overrides)
    textfit.say(f"ddp-run: resume=last: continuing {resume}"
                + (f" (the newest unfinished run with {want})" if want.given else ""), flush=True)
    return resume, want.given


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



def _keep_secrets(conf: dict[str, Any], how: Invocation) -> None:
    """Note the config's secrets: masked in everything written or printed from here on (the driver's tracebacks
    too), handed to the workers through their environment."""
    how.real = secrets.secret_keys(conf, how.env_raw)
    how.masks = secrets.secret_values(conf, how.env_raw)
    secrets.KNOWN.update(how.masks)



def new_run_dir(conf: dict[str, Any], plan: Plan, started: datetime) -> rundir.RunDir:
    """A single run's directory: ``<root>/<date>/<time>_<task>_w<ws>``."""
    return rundir.create_run_dir(conf["output"]["root"], conf["task"]["name"], plan.world_size, started)



def _planned(conf: dict[str, Any], rd: rundir.RunDir | None,
             ) -> tuple[Plan, str | None, Any, dict | None, dict[str, Any]]:
    """Plan the job (PlanError on refusal): its plan, task directory, probe, memory plan, and the settings that
    differ from its checkpoint's run (resume=<checkpoint>: they apply from its step on)."""
    recorded = (rd.read_json(layout.MANIFEST).get("invocation") or {}).get("task_dir") if rd is not None else None
    plan, task_dir, probe = plan_job(conf, [recorded] if recorded else [])
    resume = str(conf.get("resume", "auto"))
    try:
        changes = {}
        if rd is None and resume not in resume_checks.NEW_RUN:
            changes = resume_checks.check_resume_source(resume, plan, conf)
    except BaseException:
        if probe is not None:
            probe.cancel()
        raise
    mem = memory(conf, plan, probe)
    return memory_plan.with_start(plan, mem), task_dir, probe, mem, changes



def _plan(conf: dict[str, Any], rd: rundir.RunDir | None, how: Invocation,
          ) -> tuple[Plan, str | None, Any, dict | None]:
    """:func:`_planned`, the settings changed on resume noted in ``how``. A continued run plans its own config.yaml:
    a value of the wrong kind in it is damage, refused as such (naming the file)."""
    try:
        plan, task_dir, probe, mem, changes = _planned(conf, rd)
        how.resume_changes.update(changes)
    except (KeyError, TypeError, AttributeError) as exc:
        if rd is None:
            raise
        path = layout.join(rd.url, layout.CONFIG)
        raise records.DamagedFile(path, f"holds a value the plan cannot use ({type(exc).__name__}: {exc})",
                                  records.fix_for(layout.CONFIG, rd.url)).refusal() from None
    return plan, task_dir, probe, mem


def _check_trackers(conf: dict[str, Any]) -> None:
    """The trackers the config names are installed and, unless a dry run, reachable: refused (PlanError) before
    anything is created."""
    tracker_checks.check_installed(conf)
    if not conf["dry_run"]:
        tracker_checks.preflight(conf)


def _announce(conf: dict[str, Any], plan: Plan, mem: dict[str, Any] | None, quiet: bool = False) -> None:
    """The plan and the memory plan on the console (``quiet``: not for a sweep's job run in turn, whose plan is
    in its run.json), and the memory plan's warnings."""
    if not quiet:
        textfit.say(f"ddp-run: {conf['task']['name']}: {plan.explanation}; device {plan.device}, backend"
                    f" {plan.backend}", flush=True)
    if plan.micro_batch is not None and not quiet:
        textfit.say(f"ddp-run: batch.per_rank=auto: starting at {plan.per_rank_batch} ({plan.micro_batch['why']});"
                    " the ranks halve it on an out-of-memory error in the first steps, the global batch unchanged",
                    flush=True)
    if mem is not None:
        if not quiet:
            textfit.say(f"ddp-run: {memory_plan.describe(mem)}", flush=True)
        for warning in (memory_plan.tight(mem), memory_plan.fsdp_micro_batch_hint(mem, plan)):
            if warning is not None:
                textfit.say(f"ddp-run: warning: {warning}", sys.stderr, flush=True)


def _say_resume_changes(how: Invocation) -> None:
    """What differs from the checkpoint's run applies from its step on; run.json records it, the console says it."""
    if not how.resume_changes:
        return
    textfit.say(secrets.redact("ddp-run: changed on resume: " + ", ".join(
              f"{k} {c['checkpoint']!r} -> {c['used']!r}" for k, c in how.resume_changes.items())
              + (f" (from step {next(iter(how.resume_changes.values()))['from_step']})"
                 if next(iter(how.resume_changes.values()))['from_step'] is not None else ""), how.masks), flush=True)


def _dry_run(conf: dict[str, Any], plan: Plan, mem: dict[str, Any] | None, launcher: Any, task_dir: str | None,
             rd: rundir.RunDir | None, how: Invocation) -> Outcome:
    """``dry_run=true``: the exact launch command, its variables and the plan; nothing is started."""
    dry_run.print_dry_run(how.argv, how.masks, launcher.command(plan, conf["launcher"], dry_run.RUN_DIR),
                          conf["launcher"]["name"], dry_run.launch_variables(conf, plan, launcher, task_dir))
    print(secrets.redact(OmegaConf.to_yaml(OmegaConf.create({"plan": plan.to_manifest(),
                                                               layout.MANIFEST_MEMORY_PLAN: mem})), how.masks))
    if rd is not None and rd.lease is not None:
        rd.lease.release()
    return Outcome(0)


def _before_launch(conf: dict[str, Any], rd: rundir.RunDir | None, how: Invocation) -> None:
    """The process's umask for a private run, and where a new run starts when that may surprise."""
    if conf["output"].get("private"):
        # Everything this driver, torchrun and the workers create from here on (they inherit the umask) is
        # owner-only: the run directory, logs, TensorBoard files, checkpoints.
        os.umask(0o077)
    _say_where_it_starts(conf, rd, how)


# Launchers whose nodes open the run directory the job names (<rdzv_id>_<task>_w<N>): a restarted node continues it.
JOINED_LAUNCHERS = ("multinode", "kubernetes")


def _say_where_it_starts(conf: dict[str, Any], rd: rundir.RunDir | None, how: Invocation) -> None:
    """A new run from step 0 says so where that may surprise: asked to restart, or an unfinished run exists."""
    resume = str(conf.get("resume", "auto"))
    if rd is not None or how.new_run_dir is not None:  # continued in place (the workers say from where), a sweep job
        return
    if (conf.get("launcher") or {}).get("name") in JOINED_LAUNCHERS:
        return  # a node opens the job's own run directory, and continues it when it has a checkpoint
    if resume == "restart":
        textfit.say("ddp-run: resume=restart: a new run from step 0", flush=True)
    elif resume == "auto" and (note := resume_checks.note_unfinished(str(conf["output"]["root"]))):
        textfit.say(note, sys.stderr, flush=True)
