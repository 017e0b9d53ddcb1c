"""From a composed config to an accepted plan: the validation table, the task module and its checks, the data,
the devices, the launcher's own checks, the diagnostics keys and the memory plan, with torch's answers (the probe)
coming in meanwhile. Every refusal is a PlanError raised before anything starts."""

from __future__ import annotations

import sys
from typing import Any

from ddp_runner.config import inductor_settings, memory_plan, task_module, validate
from ddp_runner.config.devices import visible_gpus
from ddp_runner.config.diagnostic_keys import check as check_diagnostics
from ddp_runner.config.diagnostic_keys import resolve as resolve_diagnostics
from ddp_runner.config.plan import Plan, cpu_oversubscribed, make_plan, usable_cores
from ddp_runner.config.probe import Probe, ProbeError
from ddp_runner.console import textfit
from ddp_runner.contract import layout
from ddp_runner.contract.errors import PlanError
from ddp_runner.contract.rules import flatten
from ddp_runner.data import prep as data_prep
from ddp_runner.launch.registry import launcher_check


def start_probe(cfg: dict[str, Any], task_dir: str | None) -> Probe | None:
    """The driver's torch probe for this config, started now (None when nothing needs torch's answers)."""
    inductor = list(flatten(cfg.get("train", {}).get("inductor") or {}))
    want = (["inductor"] if inductor else []) + (["model"] if memory_plan.wanted(cfg) else [])
    if not want:
        return None
    known: dict[str, Any] = {}  # what the driver answers without torch: then nothing is started for it
    if inductor and (static := inductor_settings.settings()) is not None:
        known["inductor"] = {k: static[k] for k in inductor if k in static}
    if "model" in want:
        try:
            facts = task_module.memory_facts(cfg, task_dir)
        except Exception:  # noqa: BLE001 - a task's own arithmetic failing: torch's probe answers instead
            facts = None
        if facts is not None:
            known["model"] = facts
    return Probe(cfg, want, task_dir, layout.compile_cache_dir(str(cfg["output"]["root"])), inductor_keys=inductor,
                 known=known)


def plan_job(cfg: dict[str, Any], task_dirs: list[str]) -> tuple[Plan, str | None, Probe | None]:
    """The plan for a composed config (refusing it with PlanError), the directory the workers must search for
    the task module (None when it is installed), and the driver's probe (see runner/config/probe.py), already
    started. ``task_dirs``: where else to look (a continued run's). The resolved config takes what the plan
    decided: workers run exactly this."""
    validate.check(cfg)  # every engine and data key from the config alone, before files, tasks or devices
    for line in validate.warnings(cfg):
        textfit.say(f"ddp-run: warning: {line}", sys.stderr, flush=True)
    # A task given as a file (task.module=path/to/mytask.py) runs as its module, found in the file's folder first.
    cfg["task"]["module"], file_dir = task_module.from_file(cfg["task"].get("module"))
    task_dir = task_module.locate(cfg["task"]["module"], cwd=file_dir, extra=task_dirs)
    probe = start_probe(cfg, task_dir)  # torch's answers come in while the checks below run
    try:
        gpus = visible_gpus() if cfg["device"] != "cpu" else []
        train_samples = data_prep.prepare(cfg["data"], cfg["task"])
        task_module.run_checks(cfg, task_dir)
        train_samples = _own_train_samples(cfg, task_dir, train_samples)
        data_file = cfg["data"].get("path") if cfg["data"].get("name") == "text" else None
        plan = make_plan(cfg, gpus, train_samples=train_samples, data_file=data_file,
                         inductor_settings=_inductor_defaults(probe))
        launcher_check(cfg["launcher"], str(cfg["output"]["root"]))
        # A Slurm job's ranks run on other hosts, as do those of the Kubernetes job whose manifests are written here.
        if cfg["launcher"].get("name") != "slurm" and cfg["launcher"].get("role") != "manifest":
            _warn(cpu_oversubscribed(plan, usable_cores()))
        resolve_diagnostics(cfg)
        check_diagnostics(cfg, plan.world_size)
    except BaseException:  # refused (or interrupted): the probe must not outlive the driver
        if probe is not None:
            probe.cancel()
        raise
    cfg["batch"]["accumulation"] = plan.accumulation
    cfg["device"], cfg["backend"], cfg["world_size"] = plan.device, plan.backend, plan.world_size
    return plan, task_dir, probe


def _own_train_samples(cfg: dict[str, Any], task_dir: str | None, planned: int | None) -> int | None:
    """The training set's size the plan uses: the task's own count when its checks module gives one (a task
    that loads its own data), else the data group's. With data=synthetic the count is ``data.num_samples``,
    which the ranks hold the built set to (tasks/registry.py): it takes the task's count."""
    own = task_module.own_train_samples(cfg, task_dir)
    if own is None:
        return planned
    if cfg["data"].get("name") == "synthetic":
        cfg["data"]["num_samples"] = own
    return own


def _warn(line: str | None) -> None:
    if line:
        textfit.say(f"ddp-run: warning: {line}", sys.stderr, flush=True)


def _inductor_defaults(probe: Probe | None) -> dict[str, Any] | None:
    """The defaults of the ``train.inductor`` settings torch has (None: none were set)."""
    if probe is None or "inductor" not in probe.want:
        return None
    try:
        return probe.result()["inductor"]
    except ProbeError as exc:
        raise PlanError("train.inductor", "…", f"torch._inductor.config could not be read ({exc})",
                        "check that torch imports in this environment, or leave train.inductor out") from exc


def memory(cfg: dict[str, Any], plan: Plan, probe: Probe | None) -> dict[str, Any] | None:
    """The memory plan of an accepted plan (PlanError when it does not fit), then the probe is done with."""
    try:
        return memory_plan.check(cfg, plan, probe)
    finally:
        if probe is not None:
            probe.cancel()
