"""A planned job's launch: the run directory opened (or joined) through its launcher, the trackers' runs, the start
recorded (config.yaml, run.json), the launch, and the end told to the trackers; a stop before the launch leaves no
half-made run directory."""

from __future__ import annotations

import copy
import os
import sys
from datetime import datetime
from typing import Any

from omegaconf import OmegaConf

from ddp_runner.console import sweep_view, textfit
from ddp_runner.contract import layout, secrets, stops, tracking
from ddp_runner.contract.errors import PlanError
from ddp_runner.data import prep as data_prep
from ddp_runner.diagnostics.doctor import cheap_report
from ddp_runner.job.invocation import Invocation, Outcome, refuse, sweep_job
from ddp_runner.launch.base import Job
from ddp_runner.rundir import reserve
from ddp_runner.rundir import run_dir as rundir
from ddp_runner.rundir.manifest import initial_manifest
from ddp_runner.supervise.stop import guard
from ddp_runner.trackers import runs as tracker_runs


def on_disk(conf: dict[str, Any], env_raw: dict[str, str]) -> dict[str, Any]:
    """The config as config.yaml records it: a value from the environment as its ``${oc.env:…}`` text (resolved
    again when the run is continued), URL credentials masked. The workers get the real values from the
    environment (:data:`secrets.ENV_SECRETS`)."""
    written = copy.deepcopy(conf)
    for key, value in secrets.secret_keys(conf, env_raw).items():
        secrets.set_key(written, key, env_raw.get(key) or secrets.redact_urls(value))
    return written

def _record_start(job: Job, rd: rundir.RunDir, cmd: list[str], how: Invocation, started: datetime,
                  mem: dict[str, Any] | None, trackers: dict[str, Any]) -> dict[str, Any]:
    """config.yaml (what the workers run) and run.json (the manifest) into the opened run directory."""
    conf, plan = job.conf, job.plan
    rd.write_text(layout.CONFIG, OmegaConf.to_yaml(OmegaConf.create(job.written or on_disk(conf, how.env_raw))))
    manifest = initial_manifest(plan, cmd, conf["task"]["name"], started, invocation=how.record(job.task_dir),
                                data=data_prep.describe(conf["data"]))
    manifest = secrets.redact_tree(manifest, how.masks)
    manifest["doctor"] = cheap_report(gpu=plan.device == "cuda")  # the preflight checks that cost no time
    manifest[layout.MANIFEST_MEMORY_PLAN] = mem
    if how.resume_changes:  # what differs from the checkpoint's run, the value used, and from which step
        manifest["resume_changes"] = how.resume_changes
    manifest[tracking.MANIFEST_TRACKERS] = trackers
    if rd.continued:
        previous = rd.read_json(layout.MANIFEST)
        manifest["started"] = previous.get("started", manifest["started"])
        manifest["continued"] = previous.get("continued", []) + [started.isoformat(timespec="seconds")]
        # its `invocation` is now this resume=<dir>: what started the run is kept for reproducing it
        first = previous.get("first_invocation") or (None if previous.get("continued") else previous.get("invocation"))
        if first:
            manifest["first_invocation"] = first
    rd.write_json(layout.MANIFEST, manifest)
    if not sweep_view.in_turn(how.sweep, conf):  # a sweep's job run in turn names it in its one closing line
        textfit.say(f"ddp-run: run directory {rd.url}", flush=True)
    return manifest

def launch(job: Job, launcher: Any, how: Invocation, started: datetime, mem: dict[str, Any] | None,
           probe: Any) -> Outcome:
    """Open (or join) the run directory through the launcher, record the start, launch."""
    # The workers (torchrun inherits this environment) get the real values of what config.yaml holds masked;
    # only for the launch: nothing else this process starts inherits them.
    os.environ.pop(secrets.ENV_SECRETS, None)
    if how.real:
        os.environ[secrets.ENV_SECRETS] = secrets.encode(how.real)
    try:
        with guard.deferred():  # a stop from here on is taken whole, never half a run directory
            return _open_and_launch(job, launcher, how, started, mem, probe)
    finally:
        os.environ.pop(secrets.ENV_SECRETS, None)


def _open_and_launch(job: Job, launcher: Any, how: Invocation, started: datetime, mem: dict[str, Any] | None,
                     probe: Any) -> Outcome:
    try:
        rd = launcher.open(job)
        if rd is None:  # another node of a multi-node run: node 0's driver opens the run directory
            return Outcome(launcher.join(job))
    except PlanError as err:
        return refuse(err, sweep_job(how))
    try:
        trackers = _open_trackers(job, rd, how)
    except PlanError as err:
        if rd.continued:
            if rd.lease is not None:
                rd.lease.release()
        else:
            rd.remove()  # no half-made run directory
        return refuse(err, sweep_job(how))
    if (signum := guard.take()) is not None:  # came while the directory was opened: nothing ran
        return _stopped_before_launch(job, rd, trackers, signum)
    if rd.continued:
        job.staged = rundir.prepare_continue(rd)
    if probe is not None:
        probe.keep()  # the next job with this task and model skips the probe
    cmd = launcher.command(job.plan, job.launcher, rd.url)
    reserve.hold(rd)  # disk space for the final records, freed when finalising starts (a disk that fills meanwhile)
    manifest = _record_start(job, rd, cmd, how, started, mem, trackers)
    try:
        return Outcome(launcher.launch(job, rd, manifest), run_dir=rd.url)
    except PlanError as err:  # refused by the launcher at launch (sbatch): it left no run directory
        return refuse(err, sweep_job(how))
    except OSError as exc:  # the run directory became unwritable while it ran: one line and a true status
        from ddp_runner.supervise.finalize import failed_while

        return Outcome(failed_while(rd, manifest, "running (the run directory could not be written)", exc),
                       run_dir=rd.url)
    finally:
        reserve.release(rd)  # however the launch ended
        _close_trackers(job.conf, rd, trackers)


def _stopped_before_launch(job: Job, rd: rundir.RunDir, trackers: dict[str, Any], signum: int) -> Outcome:
    """A stop before the launch was recorded: a new run directory is removed (nothing ran in it), a continued one is
    left as it was; one line, exit 128 + the signal."""
    if rd.continued:
        if rd.lease is not None:
            rd.lease.release()
        left = f"{rd.url} is as it was"
    else:
        rd.remove()
        left = "no run directory was left"
    _close_trackers(job.conf, rd, trackers)
    guard.say(f"ddp-run: stopped by {stops.signal_name(signum)} before launching: nothing was started; {left}")
    return Outcome(128 + signum)


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
        textfit.say(f"ddp-run: warning: {warning}", sys.stderr, flush=True)
