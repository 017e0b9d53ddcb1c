"""``ddp-run``: compose (Hydra) → plan → run tree → torchrun → summary. The driver never trains.

This module is the thin shell: it parses the command line, lets Hydra compose (and sweep), and hands each job to
``runner/job/``. Hydra's entry point takes no arguments, so what one invocation carries across its jobs (the
command line, the held-back stderr, the sweep's record, the worst exit code) lives in one :class:`_Invocation`.
"""

from __future__ import annotations

import sys

from ddp_runner.supervise.stop import early

if early.is_entry(sys.argv[0], "ddp-run"):  # first: a stop while the modules below load is one line, no traceback
    early.note()

import io
import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TextIO

from ddp_runner.contract import console_streams, layout, secrets
from ddp_runner.contract.errors import PlanError
from ddp_runner.supervise.stop import guard

if TYPE_CHECKING:
    from ddp_runner.job.sweeping import Sweep

# The configs ship inside the package (conf/ in the checkout, mapped there by an editable install): found from
# any working directory.
CONFIG_PATH = "pkg://ddp_runner.conf"
# Hydra writes nothing of its own and never changes directory, whichever primary config is composed (a run
# directory's saved config.yaml, rerun with --config-dir, has no hydra section of its own).
HYDRA_QUIET = ("hydra.output_subdir=null", "hydra.run.dir=.", "hydra.sweep.dir=.", "hydra.sweep.subdir=.",
               "hydra.job.chdir=false", "hydra/job_logging=none", "hydra/hydra_logging=none")


@dataclass
class _Invocation:
    """One ``ddp-run`` command: its jobs (one, or a sweep's) run in this process, one after another."""

    argv: list[str] = field(default_factory=lambda: ["ddp-run"])
    exit: int = 0  # the worst exit code over the jobs
    jobs: int = 0
    stderr: TextIO | None = None  # the real stderr while Hydra's own is held back
    jobs_of: Sweep | None = None  # how the sweep's jobs run (in turn, concurrently, on Slurm)
    job: dict[str, Any] | None = None  # this process is one job of a concurrent sweep (runner/job/pool.py)


_run = _Invocation()


def refuse(err: PlanError) -> int:
    """Print a refusal the user can act on; return the refusal exit code."""
    from ddp_runner.job.execute import refuse as refusal

    return refusal(err).code


def _how(hc: Any, task_overrides: list[str]) -> Any:
    """How this job was asked for, from Hydra's record of it (``task_overrides``: its overrides as typed)."""
    from ddp_runner.job.execute import Invocation
    from ddp_runner.report.sweep import job_values

    multirun = hc.mode.name == "MULTIRUN"
    how = Invocation(argv=_run.argv, overrides=list(task_overrides), task_preset=hc.runtime.choices.get("task"),
                     config_name=hc.job.config_name,
                     config_sources=[s.path for s in hc.runtime.config_sources
                                     if s.provider not in ("hydra", "schema")],
                     swept=job_values(task_overrides, _run.jobs_of.record.swept) if _run.jobs_of else {})
    if multirun and _run.jobs_of is not None:  # the maker also tells ``how`` its sweep, once the directory exists
        how.new_run_dir = _run.jobs_of.run_dir_maker(hc.job.num, how)
    elif _run.job is not None:
        from ddp_runner.job.sweeping import child_run_dir_maker

        how.swept = dict(_run.job["values"])
        how.new_run_dir = child_run_dir_maker(_run.job, how)
    return how


def _app(cfg: Any) -> Any:
    """One job. Returns its objective to Hydra's sweeper (a sweep's job): a number, a failed trial, or a pending
    one for a job still running (concurrent, Slurm); see runner/job/objective.py."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    from ddp_runner.config import interpolation, overrides
    from ddp_runner.job import sweeping
    from ddp_runner.job.execute import execute, refuse
    from ddp_runner.rundir.records import env_interpolations

    sys.stderr.write(_restore_stderr())  # what Hydra said while composing (warnings), now that it succeeded
    _run.jobs += 1
    hc = HydraConfig.get()
    conf = interpolation.resolved(cfg, on_refusal=lambda err: refuse(err).code)  # a failing ${…}: exit 2
    multirun = hc.mode.name == "MULTIRUN"
    sweep = _run.jobs_of if multirun else None
    task_overrides = interpolation.as_typed(hc.overrides.task)  # as typed: a replaced one may hold a failing ${…}
    num, t0 = hc.job.num if multirun else 0, time.time()
    if sweep is not None:
        sweep.configure(conf)
        sweep.plan_all(hc, sys.argv[1:], task_overrides, bool(conf.get("dry_run")))  # at the first job only
        if (decided := sweep.decided(num)) is not None:  # refused up front
            return decided
        try:
            sweeping.check(conf)
        except PlanError as err:
            outcome = refuse(err)
            sweep.exit = max(sweep.exit, outcome.code)
            return None if conf.get("dry_run") else sweep.ended(num, task_overrides, outcome, t0)
        if sweeping.concurrent(conf):
            return sweep.start(num, task_overrides, conf)
    how = _how(hc, task_overrides)
    how.env_raw = env_interpolations(OmegaConf.to_container(cfg, resolve=False))  # secrets: never on disk
    if sweep is not None and sweeping.queued(conf):
        how.submitted = []
    elif sweep is not None:
        sweep.unfollowed(conf)
    outcome = execute(conf, how, check=lambda c: overrides.check_composed(task_overrides, c))
    if _run.job is not None:
        sweeping.write_outcome(_run.job["result"], outcome)
    if sweep is not None and conf.get("dry_run"):  # a dry run leaves nothing behind; a search only plans its trials
        sweep.exit = max(sweep.exit, outcome.code)
        return 0.0
    if sweep is not None:
        if how.submitted is not None:
            return sweep.submitted(num, task_overrides, outcome, how)
        return sweep.ended(num, task_overrides, outcome, t0)
    if outcome.code == layout.EXIT_REFUSED and not multirun:
        sys.exit(outcome.code)
    _run.exit = max(_run.exit, outcome.code)
    return None


def _hydra_args(args: list[str]) -> tuple[Any, list[str], str]:
    """The parsed command line, the arguments Hydra gets, and the primary config's path (PlanError on a bad
    ``--config-dir`` or a sweep over a group that does not exist)."""
    from ddp_runner.config import overrides, task_module

    cli = overrides.parse(args)
    # A concurrent sweep's job is a ddp-run of its own: these options as typed (it redoes what follows), its overrides.
    options = [a for a in args if a not in set(cli.overrides) and a not in ("-m", "--multirun")]
    config_path = CONFIG_PATH
    if cli.config_dir is not None:
        args, config_path = overrides.user_dir_first(args, cli.config_dir, cli.config_name, CONFIG_PATH)
        cli = overrides.parse(args)
    if config_path == CONFIG_PATH and task_module.module_only(cli.overrides):
        args = [*args, f"task={task_module.CUSTOM_PRESET}"]  # the user's module, none of the default task's keys
        cli = overrides.parse(args)
    if cli.multirun:
        overrides.check_sweep_groups(cli, config_path)
    given = {a.split("=", 1)[0] for a in cli.overrides}
    quiet = [o for o in HYDRA_QUIET if o.split("=", 1)[0] not in given]
    if cli.multirun:  # Hydra's own record of the sweep (multirun.yaml) goes to a private folder, then the sweep's
        from ddp_runner.job.sweeping import new_sweep

        _run.jobs_of = new_sweep(_run.argv, cli.overrides, options)
        hydra_dir = _run.jobs_of.record.hydra_dir
        quiet = [o if not o.startswith("hydra.sweep.dir=") else f"hydra.sweep.dir={hydra_dir}" for o in quiet]
    return cli, [*args, *quiet], config_path


@guard.guarded(lambda: _run.jobs)  # first thing: a stop before Hydra's imports is one line too
def main() -> None:
    """Console entry point of ``ddp-run``."""
    console_streams.guard()  # a closed pipe or an ASCII console never ends it (docs/run-tree.md)
    from ddp_runner.config import overrides, task_module
    task_module.register_resolver()
    args = sys.argv[1:]
    if (job := os.environ.pop(layout.ENV_SWEEP_JOB, None)) is not None:  # one job of a concurrent sweep
        import json

        _run.job = json.loads(job)
    _run.argv = ["ddp-run", *args]
    if "--version" in args:
        from ddp_runner.config.cli_help import version

        print(f"ddp-run {version()}")
        sys.exit(0)
    if "-h" in args or "--help" in args:  # the runner's own help, from the validation table (Hydra's: --hydra-help)
        from ddp_runner.config.cli_help import print_help
        from ddp_runner.console import textfit
        sys.exit(print_help(args, CONFIG_PATH, say=textfit.say))
    from ddp_runner.config.cli_help import info_args

    args = overrides.logger_list(info_args(args))
    with secrets.masked_console():  # URL credentials and oc.env values never reach the console
        _main(args)


def _main(args: list[str]) -> None:
    from ddp_runner.config import overrides

    try:
        cli, hydra_args, config_path = _hydra_args(args)
    except PlanError as err:
        sys.exit(refuse(err))
    sys.argv = [sys.argv[0], *hydra_args]
    if not cli.multirun and not any(a.startswith("hydra.mode=") for a in args):
        overrides.skip_mode_probe()
    # Hydra reports a config it cannot compose with exit code 1 and its own text; held back here, and turned
    # into a refusal (exit 2) that names the key and the fix. _app restores stderr as soon as a job starts.
    _run.stderr, sys.stderr = sys.stderr, io.StringIO()
    try:
        import hydra  # only now: the driver's stop handler comes first (runner/supervise/stop/guard.py)
        hydra.main(version_base=None, config_path=CONFIG_PATH, config_name="config")(_app)()
    except SystemExit as exc:
        held = _restore_stderr()
        if _run.jobs or exc.code != 1 or cli.info:  # only a failed composition is turned into a refusal
            sys.stderr.write(held)
            raise
        err = overrides.diagnose(cli, config_path)
        if err.key == "overrides" and held.strip():
            err = PlanError(err.key, err.value, held.strip().splitlines()[0], err.fix)
        sys.exit(refuse(overrides.on_resume(err, cli)))
    except guard.Stopped as stop:  # a sweep's, between jobs or while one ran (SweepStopped): no further job starts
        if _run.jobs_of is None or not _run.jobs:
            raise
        _run.jobs_of.stop(stop.signum)
    finally:
        _restore_stderr()
        if _run.jobs_of is not None:
            _run.jobs_of.finish()  # the jobs still running (concurrent) or queued (Slurm)
            _run.jobs_of.record.write()
    if _run.jobs_of is not None:
        _run.exit = max(_run.exit, _run.jobs_of.exit)
        _run.jobs_of.say_stopped()
    if cli.cfg == "job":  # Hydra printed the composed config; the plan changes some of it
        from ddp_runner.config.cli_help import derived

        print(derived(args, CONFIG_PATH))
    sys.exit(_run.exit)


def _restore_stderr() -> str:
    """Put the real stderr back; return what Hydra wrote meanwhile."""
    held = sys.stderr.getvalue() if isinstance(sys.stderr, io.StringIO) else ""
    if _run.stderr is not None:
        sys.stderr, _run.stderr = _run.stderr, None
    return held


if __name__ == "__main__":
    main()
