"""``resume=<run dir>``: continue a run in place, from its own config.yaml, with the settings its command line may
change (refused where its checkpoint fixes them) and its masked credentials given again."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from omegaconf import OmegaConf

from ddp_runner.config.diagnostic_keys import without_fault
from ddp_runner.console import textfit
from ddp_runner.contract import checkpoints, command_line, secrets
from ddp_runner.contract.errors import PlanError
from ddp_runner.contract.rules import flatten
from ddp_runner.rundir import records, resume_keys, resume_last
from ddp_runner.rundir import resume as resume_checks
from ddp_runner.rundir import run_dir as rundir
from ddp_runner.rundir.lease import take_or_refuse


def yaml_container(text: str) -> Any:
    """config.yaml's text as a plain container, interpolations left as text."""
    return OmegaConf.to_container(OmegaConf.create(text), resolve=False)


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
                        f"give it again on the command line: {command_line.resume(run_url)} {key}=<the URL with"
                        " its credentials>, or set the password through the environment: "
                        f"{key}=…:${{oc.env:MY_PASSWORD}}@…")


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
        textfit.say(secrets.redact(f"ddp-run: warning: continuing {run_url} with its own config.yaml; ignored: "
                                   f"{' '.join(ignored)}"), sys.stderr, flush=True)
    try:
        resume_keys.check(theirs, mine, run_url, None)
    except PlanError as err:
        raise PlanError(err.key, err.value, err.problem.replace("the checkpoint's run", "the run's own config.yaml"),
                        f"drop {err.key}= to continue the run as it was, or start a new run from its checkpoint with"
                        f" it changed where that is allowed (docs/resume.md)") from None
    return {k: (theirs[k], mine[k]) for k in resume_keys.differences(theirs, mine)}


def continued_run(resume: str, dry_run: bool, overrides: list[str], composed: dict[str, Any],
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
        textfit.say("ddp-run: note: the run's fault.* is not repeated when it is continued", sys.stderr)
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
    rundir.check_writable(rd)  # a read-only filesystem: refused like a new run there, before the lease
    rd.lease = take_or_refuse(rd.fs, rd.path, rd.url)
    rd.continued = True
    at = checkpoints.step_of(step) if step else None
    return conf, rd, env_raw, {k: {"checkpoint": old, "used": new, "from_step": at}
                               for k, (old, new) in changes.items()}

