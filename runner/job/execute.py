"""One job: plan, refuse or launch through the job's launcher, and say how it ended.

The flow, one direction: the composed config (or a continued run's own) → :func:`~ddp_runner.job.planning.plan_job`
→ dry run, or the launcher opens (or joins) the run directory → config.yaml and run.json recorded → the launcher
launches and supervises → exit code.
"""

from __future__ import annotations

import copy
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from omegaconf import OmegaConf

from ddp_runner.config import memory_plan
from ddp_runner.config.diagnostic_keys import without_fault
from ddp_runner.config.plan import Plan
from ddp_runner.contract import checkpoints, layout, secrets, stops, tracking
from ddp_runner.contract.errors import PlanError
from ddp_runner.contract.rules import flatten
from ddp_runner.data import prep as data_prep
from ddp_runner.diagnostics.doctor import cheap_report
from ddp_runner.job import dry_run
from ddp_runner.job.planning import memory, plan_job
from ddp_runner.launch import registry
from ddp_runner.launch.base import Job
from ddp_runner.rundir import records, resume_keys, resume_last
from ddp_runner.rundir import resume as resume_checks
from ddp_runner.rundir import run_dir as rundir
from ddp_runner.rundir.lease import take_or_refuse
from ddp_runner.rundir.manifest import initial_manifest
from ddp_runner.supervise.stop import guard
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
    # The sweep this job belongs to: {"id": the sweep directory's name, "dir": its URL, "job": the job number}
    # (None: not a sweep's job). Recorded in run.json (``invocation.sweep``), e.g. for a tracker's parent run.
    sweep: dict[str, Any] | None = None
    # A sweep's queued jobs (Slurm): each submitted job's (run dir, job id) is added here, and followed by the
    # sweep with the others (None: the launcher follows the job itself).
    submitted: list[Any] | None = None
    env_raw: dict[str, str] = field(default_factory=dict)  # keys set by ${oc.env:…}: their text, never their value
    masks: list[str] = field(default_factory=list)  # the secret strings nothing written or printed may hold
    real: dict[str, str] = field(default_factory=dict)  # {key: real value} of what config.yaml holds masked
    resume_changes: dict[str, Any] = field(default_factory=dict)  # settings changed on resume (run.json)

    def record(self, task_dir: str | None) -> dict[str, Any]:
        """``invocation`` in run.json."""
        return {"argv": self.argv, "cwd": os.getcwd(), "overrides": self.overrides, "task_preset": self.task_preset,
                "paths_given": self.paths_given,
                "config_name": self.config_name, "config_sources": self.config_sources, "task_dir": task_dir,
                # This job's value of each key the sweep varies (TensorBoard's HPARAMS table shows them).
                "swept": self.swept, "sweep": self.sweep}


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
    """Print a refusal the user can act on (its secrets masked); the refused outcome."""
    print(secrets.redact(f"ddp-run: refused: {err.key}={err.value!r}: {err.problem}.\n"
                         f"  key:   {err.key}\n  value: {err.value!r}\n  fix:   {err.fix}\n"
                         "Nothing was started and no run directory was created.", secrets.KNOWN), file=sys.stderr)
    return Outcome(layout.EXIT_REFUSED,
                   reason=secrets.redact(f"refused: {err.key}={err.value!r}: {err.problem}", secrets.KNOWN))


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


def yaml_container(text: str) -> Any:
    """config.yaml's text as a plain container, interpolations left as text."""
    return OmegaConf.to_container(OmegaConf.create(text), resolve=False)


def on_disk(conf: dict[str, Any], env_raw: dict[str, str]) -> dict[str, Any]:
    """The config as config.yaml records it: a value from the environment as its ``${oc.env:…}`` text (resolved
    again when the run is continued), URL credentials masked. The workers get the real values from the
    environment (:data:`secrets.ENV_SECRETS`)."""
    written = copy.deepcopy(conf)
    for key, value in secrets.secret_keys(conf, env_raw).items():
        secrets.set_key(written, key, env_raw.get(key) or secrets.redact_urls(value))
    return written


def _keep_secrets(conf: dict[str, Any], how: Invocation) -> None:
    """Note the config's secrets: masked in everything written or printed from here on (the driver's tracebacks
    too), handed to the workers through their environment."""
    how.real = secrets.secret_keys(conf, how.env_raw)
    how.masks = secrets.secret_values(conf, how.env_raw)
    secrets.KNOWN.update(how.masks)


def _restore_redacted(conf: dict[str, Any], run_url: str, overrides: list[str]) -> None:
    """A continued run's config.yaml holds URL credentials masked: the command line gives them again (the same
    URL), or the continuation is refused before launch."""
    given = {o.split("=", 1)[0].lstrip("+~"): o.split("=", 1)[1] for o in overrides if "=" in o}
    for key, value in flatten(conf).items():
        if not secrets.is_redacted(value):
            continue
        if key in given and secrets.redact_urls(given[key]) == value:
            secrets.set_key(conf, key, given[key])
            continue
        raise PlanError(key, value, f"{run_url}'s config.yaml holds its credentials masked (never written to disk),"
                        " so the workers cannot use it as recorded",
                        f"give it again on the command line: ddp-run resume={run_url} {key}=<the URL with its"
                        " credentials>, or set the password through the environment: "
                        f"{key}=…:${{oc.env:MY_PASSWORD}}@…")


def new_run_dir(conf: dict[str, Any], plan: Plan, started: datetime) -> rundir.RunDir:
    """A single run's directory: ``<root>/<date>/<time>_<task>_w<ws>``."""
    return rundir.create_run_dir(conf["output"]["root"], conf["task"]["name"], plan.world_size, started)


# What a continued run takes from the command line; everything else is its own config.yaml.
CONTINUE_KEYS = resume_last.CONTINUE_KEYS
# ... and a key whose recorded value has its credentials masked, given again with them (see _restore_redacted).


def _int_or_refuse(key: str, value: str) -> int:
    if not value.isdigit() or int(value) <= 0:
        raise PlanError(key, value, "must be a positive number of optimizer steps", f"e.g. {key}=1000")
    return int(value)


def _settings_changed(conf: dict[str, Any], composed: dict[str, Any], overrides: list[str], run_url: str,
                      ) -> dict[str, tuple[Any, Any]]:
    """The settings a continued run's command line changes (their values as Hydra composed them): refused
    (PlanError) when the checkpoint fixes them (runner/rundir/resume_keys.py), else ``{key: (old, new)}``, applied
    from the step it continues at. A config group named (``data=text``) is ignored, with a warning."""
    recorded, given = flatten(conf), flatten(composed)
    theirs, mine, ignored = {}, {}, []
    for o in overrides:
        key = o.split("=", 1)[0].lstrip("+~")
        if key in CONTINUE_KEYS or secrets.is_redacted(recorded.get(key)) or key.startswith("hydra"):
            continue
        if key in ("world_size", "batch.accumulation") or key.startswith("fault"):  # the run's own
            ignored.append(o)
        elif key in given or key in recorded:
            theirs[key], mine[key] = recorded.get(key, "<absent>"), given.get(key, "<absent>")
        else:
            ignored.append(o)
    if ignored:
        print(secrets.redact(f"ddp-run: warning: continuing {run_url} with its own config.yaml; ignored: "
                             f"{' '.join(ignored)}"), file=sys.stderr, flush=True)
    try:
        resume_keys.check(theirs, mine, run_url, None)
    except PlanError as err:
        raise PlanError(err.key, err.value, err.problem.replace("the checkpoint's run", "the run's own config.yaml"),
                        f"drop {err.key}= to continue the run as it was, or start a new run from its checkpoint with"
                        f" it changed where that is allowed (docs/resume.md)") from None
    return {k: (theirs[k], mine[k]) for k in resume_keys.differences(theirs, mine)}


def _continued_run(resume: str, dry_run: bool, overrides: list[str], composed: dict[str, Any],
                   chose: Sequence[str] = (),
                   ) -> tuple[dict[str, Any], rundir.RunDir, dict[str, str], dict[str, Any]]:
    """``resume=<run dir>``: that run's own config, the directory, its lease taken (held until this driver
    exits), and the config's keys set from the environment (:func:`records.env_interpolations`). Workers take
    the run's own newest checkpoint first and fall back to where the run started from. ``chose``: the overrides
    that chose this run (resume=last): they match it, and are no setting to change or ignore."""
    rd = rundir.open_run_dir(resume)
    try:  # a damaged record is a refusal that names the file, never a traceback
        conf = records.read_config(rd.fs, rd.path)
        env_raw = records.env_interpolations(yaml_container(records.read_config_text(rd.fs, rd.path)))
        previous = records.read_manifest(rd.fs, rd.path)
        records.read_summary(rd.fs, rd.path)
    except records.DamagedFile as damaged:
        raise damaged.refusal() from None
    conf["dry_run"] = dry_run
    if without_fault(conf):  # a rehearsal fault strikes once, not again in the continued run
        print("ddp-run: note: the run's fault.* is not repeated when it is continued", file=sys.stderr)
    keys = {o.split("=", 1)[0].lstrip("+~"): o.split("=", 1)[-1] for o in overrides}
    changes = _settings_changed(conf, composed, [o for o in overrides if o not in chose], rd.url)
    resume_checks.check_no_live_driver(rd.url, previous)
    max_steps = _int_or_refuse("train.max_steps", keys["train.max_steps"]) if "train.max_steps" in keys else None
    resume_checks.check_continuable(rd.url, previous, conf, max_steps)  # before the lease: a refusal changes nothing
    if max_steps is not None:
        conf["train"]["max_steps"] = max_steps
    _restore_redacted(conf, rd.url, overrides)
    step = resume_checks.newest_checkpoint(rd.url)
    for key, (_, new) in changes.items():  # applied from the step it continues at, and recorded so
        secrets.set_key(conf, key, new)
    rd.lease = take_or_refuse(rd.fs, rd.path, rd.url)
    rd.continued = True
    at = checkpoints.step_of(step) if step else None
    return conf, rd, env_raw, {k: {"checkpoint": old, "used": new, "from_step": at}
                               for k, (old, new) in changes.items()}


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
    return plan, task_dir, probe, memory(conf, plan, probe), changes


def _announce(conf: dict[str, Any], plan: Plan, mem: dict[str, Any] | None) -> None:
    print(f"ddp-run: {conf['task']['name']}: {plan.explanation}; device {plan.device}, backend {plan.backend}",
          flush=True)
    if mem is not None:
        print(f"ddp-run: {memory_plan.describe(mem)}", flush=True)
        for warning in (memory_plan.tight(mem), memory_plan.fsdp_micro_batch_hint(mem, plan)):
            if warning is not None:
                print(f"ddp-run: warning: {warning}", file=sys.stderr, flush=True)


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
    rd.write_json(layout.MANIFEST, manifest)
    print(f"ddp-run: run directory {rd.url}", flush=True)
    return manifest


def execute(composed: dict[str, Any], how: Invocation,
            check: Callable[[dict[str, Any]], None] | None = None) -> Outcome:
    """One job: plan, refuse or launch, supervise, summarise. ``check``: refuses (PlanError) a composed config the
    command line broke (e.g. a required key removed); a continued run's own config is not checked by it."""
    t0, started = time.time(), datetime.now()
    resume = str(composed.get("resume", "auto"))
    rd = None
    try:
        conf = composed
        chose: list[str] = []  # the overrides that chose the run resume=last continues
        if resume == resume_checks.LAST:
            resume, want = resume_last.choose(str(composed["output"]["root"]), composed, how.overrides)
            chose = want.given
            print(f"ddp-run: resume=last: continuing {resume}"
                  + (f" (the newest unfinished run with {want})" if chose else ""), flush=True)
        if resume not in resume_checks.NEW_RUN:  # what the workers will pass over, said before launch
            for note in resume_checks.skipped_notes(resume):
                print(f"ddp-run: note: {note}", file=sys.stderr, flush=True)
        if resume not in resume_checks.NEW_RUN and resume_checks.is_run_dir(resume):
            conf, rd, how.env_raw, how.resume_changes = _continued_run(resume, bool(composed.get("dry_run")),
                                                                       how.overrides, composed, chose)
        else:
            how.paths_given = absolute_paths(conf)
            if check is not None:
                check(conf)
        _keep_secrets(conf, how)  # before planning: a refusal's message is masked too
        try:
            plan, task_dir, probe, mem, changes = _planned(conf, rd)
            how.resume_changes.update(changes)
        except (KeyError, TypeError, AttributeError) as exc:
            if rd is None:
                raise
            # A continued run plans its own config.yaml: a value of the wrong kind in it is damage, named as such.
            path = layout.join(rd.url, layout.CONFIG)
            raise records.DamagedFile(path, f"holds a value the plan cannot use ({type(exc).__name__}: {exc})",
                                      records.fix_for(layout.CONFIG, rd.url)).refusal() from None
        tracker_checks.check_installed(conf)
        if not conf["dry_run"]:  # before anything is created: a tracker that cannot be reached refuses the launch
            tracker_checks.preflight(conf)
    except PlanError as err:
        if rd is not None and rd.lease is not None:  # refused after taking the lease: give it back now
            rd.lease.release()
        return refuse(err)
    _keep_secrets(conf, how)
    _announce(conf, plan, mem)
    if how.resume_changes:  # what differs from the checkpoint's run applies from its step on; run.json records it
        print(secrets.redact("ddp-run: changed on resume: " + ", ".join(
            f"{k} {c['checkpoint']!r} -> {c['used']!r}" for k, c in how.resume_changes.items())
            + (f" (from step {next(iter(how.resume_changes.values()))['from_step']})"
               if next(iter(how.resume_changes.values()))['from_step'] is not None else ""), how.masks), flush=True)
    launcher = registry.get(conf["launcher"])
    if conf["dry_run"]:
        dry_run.print_dry_run(how.argv, how.masks, launcher.command(plan, conf["launcher"], dry_run.RUN_DIR),
                              conf["launcher"]["name"], dry_run.launch_variables(conf, plan, launcher, task_dir))
        print(secrets.redact(OmegaConf.to_yaml(OmegaConf.create({"plan": plan.to_manifest(),
                                                                   layout.MANIFEST_MEMORY_PLAN: mem})), how.masks))
        if rd is not None and rd.lease is not None:
            rd.lease.release()
        return Outcome(0)
    if conf["output"].get("private"):
        # Everything this driver, torchrun and the workers create from here on (they inherit the umask) is
        # owner-only: the run directory, logs, TensorBoard files, checkpoints.
        os.umask(0o077)
    _say_where_it_starts(conf, rd, how)
    make = how.new_run_dir or new_run_dir
    job = Job(conf, plan, t0, task_dir, rd=rd, new_run_dir=lambda: make(conf, plan, started),
              submitted=how.submitted, written=on_disk(conf, how.env_raw))
    return _launch(job, launcher, how, started, mem, probe)


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
        print("ddp-run: resume=restart: a new run from step 0", flush=True)
    elif resume == "auto" and (note := resume_checks.note_unfinished(str(conf["output"]["root"]))):
        print(note, file=sys.stderr, flush=True)


def _launch(job: Job, launcher: Any, how: Invocation, started: datetime, mem: dict[str, Any] | None,
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
    if (signum := guard.take()) is not None:  # came while the directory was opened: nothing ran
        return _stopped_before_launch(job, rd, trackers, signum)
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
    except OSError as exc:  # the run directory became unwritable while it ran: one line and a true status
        from ddp_runner.supervise.finalize import failed_while

        return Outcome(failed_while(rd, manifest, "running (the run directory could not be written)", exc),
                       run_dir=rd.url)
    finally:
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
        print(f"ddp-run: warning: {warning}", file=sys.stderr, flush=True)
