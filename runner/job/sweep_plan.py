"""Every job of a grid sweep (Hydra's basic sweeper), known before the first one starts.

- Each job is planned up front (the plan's arithmetic: the validation table, ranks, batch, devices; no files, task
  module or torch), so that a job the plan refuses is refused before any job runs, not after the earlier ones ran
  (``-m experiment=fixed_global_batch world_size=1,2,3`` with a global batch 3 ranks cannot share).
- A stopped sweep records every job it did not start as ``not run``.

A search sweeper (Optuna, …) asks for its trials one by one: it has no list, and nothing here applies to it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

from ddp_runner.config import interpolation, overrides, validate
from ddp_runner.config.plan import make_plan
from ddp_runner.contract.errors import PlanError
from ddp_runner.rundir import resume as resume_checks


def grid_jobs(hc: Any, args: Sequence[str], typed: Sequence[str]) -> list[list[str]] | None:
    """The overrides of every job of this sweep in Hydra's order, read from the command line ``args`` as Hydra got
    them; None unless the sweeper is the basic one and the list agrees with Hydra's own for this job (``typed``:
    its overrides as Hydra recorded them)."""
    if hc.runtime.choices.get("hydra/sweeper") != "basic":
        return None
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser

    params = [f"{k}={v}" for k, v in (hc.sweeper.get("params") or {}).items()]
    try:
        parser = OverridesParser.create(config_loader=GlobalHydra.instance().config_loader())
        parsed = [o for o in parser.parse_overrides([*params, *overrides.parse(list(args)).overrides])
                  if not o.is_hydra_override()]
        jobs = [list(job) for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]
    except Exception:  # noqa: BLE001 - a list this module cannot make: the sweep runs as before, job by job
        return None
    num = hc.job.num
    return jobs if num < len(jobs) and jobs[num] == list(typed) else None


def refusals(hc: Any, jobs: Sequence[Sequence[str]], skip: int) -> dict[int, PlanError]:
    """Each job (but ``skip``, the one running now, planned in full at its turn) that its plan's arithmetic
    refuses, and why. A job this cannot judge (a dry run, a continued run, a config that fails to compose) is
    left to its turn."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import RunMode

    loader = GlobalHydra.instance().config_loader()
    found: dict[int, PlanError] = {}
    gpus = _gpus_once()
    for num, job in enumerate(jobs):
        if num == skip:
            continue
        try:
            cfg = loader.load_configuration(config_name=hc.job.config_name, run_mode=RunMode.RUN,
                                            overrides=[*interpolation.as_typed(hc.overrides.hydra), *job])
        except Exception:  # noqa: BLE001 - Hydra says it at the job's turn, as before
            continue
        try:
            check(cfg, list(job), gpus)
        except PlanError as err:
            found[num] = err
    return found


def check(cfg: Any, job: list[str], gpus: Callable[[], list[Any]]) -> None:
    """Refuse (PlanError) the composed config ``cfg`` of a job the plan's arithmetic refuses."""
    from omegaconf import open_dict, read_write

    cfg = copy.deepcopy(cfg)
    with read_write(cfg), open_dict(cfg):
        del cfg["hydra"]  # as the job function gets it
    conf = interpolation.resolved(cfg)
    if conf.get("dry_run") or str(conf.get("resume", "auto")) not in resume_checks.NEW_RUN:
        return  # a dry run costs nothing; a continued run plans its own config.yaml
    overrides.check_composed(job, conf)
    validate.check(conf)
    make_plan(conf, gpus() if conf.get("device") != "cpu" else [])


def _gpus_once() -> Callable[[], list[Any]]:
    """The visible GPUs, asked once (nvidia-smi) and only when a job may run on them."""
    seen: list[list[Any]] = []

    def gpus() -> list[Any]:
        if not seen:
            from ddp_runner.config.devices import visible_gpus

            seen.append(visible_gpus())
        return seen[0]

    return gpus
