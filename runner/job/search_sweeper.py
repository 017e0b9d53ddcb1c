"""The loop of ``hydra/sweeper=ddp_search`` (the Hydra plugin, ``hydra_plugins/ddp_runner_search``, only hands its
calls here): ask Optuna for a trial, launch it as one job of the sweep, and go on as soon as a slot is free, so a
pruned trial's devices go to the next trial at once (no batches). What the trials report and how they end is
:mod:`ddp_runner.job.search`'s.

The search space is the command line's sweep overrides (Hydra's syntax, as the Optuna sweeper reads it):
``choice(a,b)`` and ``range(…)`` are categorical, ``interval(lo,hi)`` a float (``tag(int, interval(…))`` whole
numbers), with ``tag(log, interval(…))`` on a log scale; ``hydra.sweeper.params`` adds more
(``{key: "interval(1e-4,1)"}``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from ddp_runner.console import textfit
from ddp_runner.job import search

RESULTS = "optimization_results.yaml"  # the search's best trial, in Hydra's sweep folder (kept in the sweep dir)


def distribution(override: Any) -> Any:
    """Optuna's distribution of one Hydra sweep override (choice, range, interval, log tag)."""
    from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, RangeSweep
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    value = override.value()
    tags = getattr(value, "tags", set())
    log = "log" in tags
    if isinstance(value, IntervalSweep):
        if "int" in tags:  # Hydra's interval is a float interval; tag(int, …) makes it whole numbers
            return IntDistribution(int(value.start), int(value.end), log=log)
        return FloatDistribution(float(value.start), float(value.end), log=log)
    if isinstance(value, RangeSweep):
        return CategoricalDistribution(list(override.sweep_iterator()))
    if isinstance(value, ChoiceSweep):
        return CategoricalDistribution([str(v) if not isinstance(v, (int, float, str, bool)) or v is None else v
                                        for v in override.sweep_iterator()])
    raise ValueError(f"{override.input_line}: not a sweep ddp_search can search (choice, range, interval)")


def space(arguments: Sequence[str], params: Mapping[str, Any] | None) -> tuple[dict[str, Any], list[str]]:
    """The search space (key → distribution) and the fixed overrides of a command line plus
    ``hydra.sweeper.params``."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    lines = [*arguments, *(f"{k}={v}" for k, v in (params or {}).items())]
    dists: dict[str, Any] = {}
    fixed: list[str] = []
    for o in parser.parse_overrides(lines):
        if o.is_sweep_override():
            dists[o.get_key_element()] = distribution(o)
        else:
            fixed.append(o.input_line)
    return dists, fixed


def trial_overrides(params: Mapping[str, Any], fixed: Sequence[str]) -> list[str]:
    """One trial's command line: the fixed overrides and its sampled values."""
    return [*fixed, *(f"{k}={v!r}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items())]


SAMPLERS = ("tpe", "random", "grid")


def make_sampler(name: str, seed: int | None, dists: Mapping[str, Any]) -> Any:
    """Optuna's sampler for ``hydra.sweeper.sampler``: ``tpe`` (default), ``random``, or ``grid`` (every
    combination of the choice and range values once, in an order drawn from ``seed``)."""
    import optuna

    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "grid":
        if not all(hasattr(d, "choices") for d in dists.values()):
            raise ValueError("hydra.sweeper.sampler=grid: every swept key must be a choice(…) or a range(…)")
        return _grid({k: list(d.choices) for k, d in dists.items()}, seed)
    raise ValueError(f"hydra.sweeper.sampler={name}: not one of {', '.join(SAMPLERS)}")


def _grid(grid: dict[str, list[Any]], seed: int | None) -> Any:
    """Optuna's grid, whose end does not stop the study: ``Study.stop`` works only inside ``optimize`` (raising in
    a tell, it would lose the last trial's state); the sweeper asks no more than ``n_trials`` anyway."""
    import optuna

    class Grid(optuna.samplers.GridSampler):
        def after_trial(self, study: Any, trial: Any, state: Any, values: Any) -> None:
            return None

    return Grid(grid, seed=seed)


def open_study(folder: str | None, direction: str, pruner: Any, sampler: Any, resume: bool) -> Any:
    """The study in ``folder``'s journal file (Optuna's file storage: safe across processes; None: in memory);
    continued when ``resume``."""
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    storage = (JournalStorage(JournalFileBackend(os.path.join(folder, search.STUDY_FILE))) if folder is not None
               else None)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.create_study(storage=storage, study_name=search.STUDY_NAME, direction=direction, pruner=pruner,
                               sampler=sampler, load_if_exists=resume)


def continued(fixed: list[str], setting: Any) -> tuple[str | None, list[str]]:
    """The sweep directory whose search this one continues (``hydra.sweeper.resume=<dir>``, or ``resume=<dir>``
    naming a directory that holds a study), and the trials' fixed overrides without that ``resume=``."""
    if setting:
        return str(setting).rstrip("/"), fixed
    for o in fixed:
        key, _, value = o.partition("=")
        if key == "resume" and os.path.isfile(os.path.join(value.removeprefix("file://"), search.STUDY_FILE)):
            return value.rstrip("/"), [f for f in fixed if f is not o]
    return None, fixed


def run(sweeper: Any, arguments: list[str]) -> None:
    """The search: ``sweeper`` is the Hydra plugin (its settings, config and launcher)."""
    from ddp_runner.job import sweeping

    sweep = sweeping.active
    if sweep is None:
        raise RuntimeError("hydra/sweeper=ddp_search runs under ddp-run -m only")
    cfg = sweeper.config
    sweep.configure(cfg)
    direction = str(cfg.get("sweep", {}).get("direction") or "minimize")
    dists, fixed, pruner, sampler = _settings(sweeper, arguments)
    resume, fixed = continued(fixed, sweeper.resume)
    sweep.record.swept += [k for k in dists if k not in sweep.record.swept]  # hydra.sweeper.params' keys too
    if resume is not None:  # the trials go on in the same sweep directory, numbered after its earlier ones
        sweep.record.sweep_dir = resume
        sweep.record.restore()
    # A dry run only plans its trials and leaves nothing behind: its study is in memory.
    folder = None if cfg.get("dry_run") else _local(sweep.directory())
    study = open_study(folder, direction, pruner, sampler, resume is not None)
    if resume is not None and (again := search.requeue_stopped(study)):
        textfit.say(f"ddp-run: sweep: continuing the search in {resume}: {len(again)} trial(s) a stop cut short run"
                    " again first", flush=True)
    found = search.Search(study, sweeper.pruner, sweep.record.objective["key"])
    search.current = found
    sweep.record.search = {"pruner": sweeper.pruner, "sampler": str(sweeper.sampler), "n_trials": sweeper.n_trials,
                           "study": search.STUDY_FILE}
    try:
        _ask_and_launch(sweeper, sweep, found, dists, fixed)
        sweep.settle()
    finally:
        search.current = None
    _results(cfg, study, direction)


def _settings(sweeper: Any, arguments: list[str]) -> tuple[dict[str, Any], list[str], Any, Any]:
    """The search space, the fixed overrides, the pruner and the sampler; a setting that makes none is refused
    (exit 2) before any trial starts."""
    import sys

    from ddp_runner.contract.errors import PlanError
    from ddp_runner.job.invocation import refuse

    try:
        dists, fixed = space(arguments, sweeper.params)
        pruner = search.make_pruner(str(sweeper.pruner), sweeper.warmup_steps, sweeper.startup_trials,
                                    sweeper.min_steps)
        return dists, fixed, pruner, make_sampler(str(sweeper.sampler), sweeper.seed, dists)
    except ValueError as exc:
        key, _, problem = str(exc).partition(": ")
        if not key.startswith("hydra.sweeper."):
            key, problem = "hydra.sweeper", str(exc)
        err = PlanError(key.split("=", 1)[0], key.partition("=")[2] or None, problem,
                        "see docs/sweeps.md, 'Searches': pruners median|asha|hyperband|none, samplers tpe|random|grid")
        sys.exit(refuse(err).code)


def _ask_and_launch(sweeper: Any, sweep: Any, found: search.Search, dists: dict[str, Any],
                    fixed: list[str]) -> None:
    """Ask and launch the trials still to run (a continued search: ``n_trials`` less those that ended before,
    a stopped or never started one not counted); each launch waits for a free slot."""
    left = int(sweeper.n_trials) - search.ended_before(found.study)
    num = max(len(found.study.trials), 1 + max((j["job"] for j in sweep.record.jobs), default=-1))
    for _ in range(max(0, left)):
        if sweep.stopped():
            break
        trial = found.study.ask(dists)
        found.add(num, trial)
        sweeper.launcher.launch([trial_overrides(trial.params, fixed)], initial_job_idx=num)
        rec = next((j for j in sweep.record.jobs if j["job"] == num), None)
        if rec is not None and rec.get("status") in ("not run", "refused"):  # the pool never started it
            found.ended(num, rec)
        num += 1


def _results(cfg: Any, study: Any, direction: str) -> None:
    """The best trial in Hydra's sweep folder, as Optuna's Hydra sweeper leaves it (kept in the sweep dir)."""
    from omegaconf import OmegaConf

    try:
        best = study.best_trial
    except ValueError:  # no trial completed
        return
    OmegaConf.save(OmegaConf.create({"name": "ddp_search", "direction": direction,
                                     "best_params": dict(best.params), "best_value": best.value}),
                   os.path.join(str(cfg.hydra.sweep.dir), RESULTS))


def _local(folder: str) -> str:
    """The study's folder on this host (the journal is a plain local file)."""
    if "://" in folder and not folder.startswith("file://"):
        raise RuntimeError(f"hydra/sweeper=ddp_search keeps its study in a local sweep directory, not {folder}")
    return folder.removeprefix("file://")
