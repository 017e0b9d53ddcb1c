"""``ddp-run``: compose (Hydra) → plan → run tree → torchrun → summary. The driver never trains."""

from __future__ import annotations

import shlex
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from runner import layout
from runner.manifest import PROJECT_ROOT
from runner.plan import Plan, PlanError, make_plan

CONF_DIR = PROJECT_ROOT / "conf"

# Worst exit code over the jobs of this invocation (a sweep runs several in one process).
_state: dict[str, Any] = {"exit": 0, "sweep_dir": None}


def inductor_settings() -> dict[str, Any]:
    """torch._inductor's settings and their defaults (imported only when ``train.inductor`` sets something)."""
    import torch._inductor.config as inductor_config

    return inductor_config.get_config_copy()


def refuse(err: PlanError) -> int:
    """Print a refusal the user can act on; return the refusal exit code."""
    print(f"ddp-run: refused: {err.key}={err.value!r}: {err.problem}.\n"
          f"  key:   {err.key}\n  value: {err.value!r}\n  fix:   {err.fix}\n"
          "Nothing was started and no run directory was created.", file=sys.stderr)
    return layout.EXIT_REFUSED


def check_group_overrides(args: list[str]) -> None:
    """Refuse an unknown ``task=``/``data=``/``launcher=`` option before Hydra does (with exit 2, not 1)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        overrides = OverridesParser.create().parse_overrides([a for a in args if not a.startswith("-")])
    except Exception:  # noqa: BLE001 - Hydra itself reports malformed overrides
        return
    for o in overrides:
        group = o.key_or_group
        if group not in ("task", "data", "launcher") or o.is_delete():
            continue
        options = sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))
        values = list(o.sweep_string_iterator()) if o.is_sweep_override() else [o.value()]
        for v in values:
            if str(v) not in options:
                sys.exit(refuse(PlanError(group, v, f"no such {group}", f"pick one of: {', '.join(options)}")))


def _plan(cfg: dict[str, Any]) -> tuple[Plan, str | None]:
    """The plan for a composed config (refusing it with PlanError), and the directory the workers must search
    for the task module (None when it is installed)."""
    from runner import data_prep, task_module
    from runner.devices import visible_gpus

    task_dir = task_module.locate(cfg["task"].get("module"))
    gpus = visible_gpus() if cfg["device"] != "cpu" else []
    train_samples = data_prep.prepare(cfg["data"], cfg["task"])
    task_module.run_checks(cfg, task_dir)
    plan = make_plan(cfg, gpus, train_samples=train_samples,
                     inductor_settings=inductor_settings() if cfg.get("train", {}).get("inductor") else None)
    # The resolved config holds what the plan decided: workers run exactly this.
    cfg["batch"]["accumulation"] = plan.accumulation
    cfg["device"], cfg["backend"], cfg["world_size"] = plan.device, plan.backend, plan.world_size
    return plan, task_dir


def execute(cfg: DictConfig) -> int:
    """One job: plan, refuse or launch, supervise, summarise. Returns the job's exit code."""
    from runner import finalize, rundir
    from runner.launch import Supervisor, torchrun_command, worker_env

    t0 = time.time()
    started = datetime.now()
    resume = str(cfg.resume)
    try:
        continuing = resume not in ("auto", "never") and _is_run_dir(resume)
        if continuing:  # continue that run in place, with its own config (its own `resume` too: workers
            # take the run's own newest checkpoint first and fall back to where the run started from)
            rd = rundir.open_run_dir(resume)
            with rd.fs.open(layout.join(rd.path, layout.CONFIG)) as f:
                conf = OmegaConf.to_container(OmegaConf.create(f.read().decode()), resolve=True)
            conf["dry_run"] = bool(cfg.dry_run)
            _warn_ignored_overrides(rd.url)
        else:
            conf = OmegaConf.to_container(cfg, resolve=True)
        plan, task_dir = _plan(conf)
        if not continuing and resume not in ("auto", "never"):
            _check_resume_source(resume, plan)
    except PlanError as err:
        return refuse(err)

    task = conf["task"]["name"]
    print(f"ddp-run: {task}: {plan.explanation}; device {plan.device}, backend {plan.backend}", flush=True)
    if conf["dry_run"]:
        cmd = torchrun_command(plan, conf["launcher"], "<run dir>")
        print("ddp-run: dry run, nothing launched. Command:\n  " + shlex.join(cmd))
        print(OmegaConf.to_yaml(OmegaConf.create({"plan": plan.to_manifest()})))
        return 0

    if not continuing:
        try:
            rd = _new_run_dir(conf, plan, started)
        except PlanError as err:
            return refuse(err)
    else:
        rundir.prepare_continue(rd)
    cmd = torchrun_command(plan, conf["launcher"], rd.url)
    rd.write_text(layout.CONFIG, OmegaConf.to_yaml(OmegaConf.create(conf)))
    from runner.manifest import initial_manifest

    manifest = initial_manifest(plan, cmd, task, started)
    if continuing:
        previous = rd.read_json(layout.MANIFEST)
        manifest["started"] = previous.get("started", manifest["started"])
        manifest["continued"] = previous.get("continued", []) + [started.isoformat(timespec="seconds")]
    rd.write_json(layout.MANIFEST, manifest)
    print(f"ddp-run: run directory {rd.url}", flush=True)

    env = worker_env(rd.url, rd.local, t0, restarts=conf["launcher"].get("max_restarts", 0), task_path=task_dir)
    sup = Supervisor(cmd, env, str(Path(rd.local, layout.LOGS, "torchrun.log")))
    mirror = finalize.Mirror(rd) if rd.is_remote else None
    rc = sup.run(on_tick=mirror.tick if mirror else None)
    code = finalize.finish(rd, manifest, plan, rc, sup.interrupted)
    if mirror:
        mirror.flush()
    print(rd.url, flush=True)
    return code


def _is_run_dir(url: str) -> bool:
    import fsspec

    try:
        fs, path = fsspec.core.url_to_fs(url)
        return fs.exists(layout.join(path, layout.CONFIG)) and fs.exists(layout.join(path, layout.MANIFEST))
    except (OSError, ValueError, ImportError) as exc:
        raise PlanError("resume", url, f"cannot be read ({type(exc).__name__}: {exc})",
                        "use resume=auto, resume=never, a run directory or a checkpoints/step_<N> path") from exc


def _warn_ignored_overrides(run_url: str) -> None:
    """``resume=<run dir>`` runs that run's own config: say which command-line overrides have no effect."""
    if not HydraConfig.initialized():
        return
    ignored = [o for o in HydraConfig.get().overrides.task
               if o.split("=", 1)[0].lstrip("+~") not in ("resume", "output.root", "dry_run")]
    if ignored:
        print(f"ddp-run: warning: continuing {run_url} with its own config.yaml; ignored: {' '.join(ignored)}",
              file=sys.stderr, flush=True)


def _check_resume_source(resume: str, plan: Plan) -> None:
    """Refuse before launch a source that holds no complete checkpoint, or a checkpoint from a run with another
    world size (its RNG and data order would not carry over)."""
    import json

    import fsspec

    fix = "use resume=auto, resume=never, a run directory or a checkpoints/step_<N> path"
    try:
        fs, path = fsspec.core.url_to_fs(resume)
        path = path.rstrip("/")
        if path.endswith("/" + layout.CKPT_STATE):
            path = path.rsplit("/", 1)[0]
        if not fs.exists(path):
            raise PlanError("resume", resume, "no such run directory or checkpoint", fix)
        # A checkpoint counts only once its commit marker exists (see tasks/checkpoint.py).
        if fs.exists(layout.join(path, layout.CKPT_MARKER)):
            run = path.rsplit("/", 2)[0]  # <run>/checkpoints/step_<N>
        elif fs.glob(layout.join(path, "step_*", layout.CKPT_MARKER)):
            run = path.rsplit("/", 1)[0]  # <run>/checkpoints
        else:
            raise PlanError("resume", resume, "holds no complete checkpoint (no step_<N>/meta.json)", fix)
        manifest = layout.join(run, layout.MANIFEST)
        ws = json.loads(fs.cat_file(manifest)).get("plan", {}).get("world_size") if fs.exists(manifest) else None
    except PlanError:
        raise
    except (OSError, ValueError, ImportError) as exc:
        raise PlanError("resume", resume, f"cannot be read ({type(exc).__name__}: {exc})", fix) from exc
    if ws is not None and ws != plan.world_size:
        raise PlanError("world_size", plan.world_size,
                        f"the checkpoint's run used world_size={ws}; per-rank RNG states and the data"
                        " order would not carry over", f"resume with world_size={ws}")


def _new_run_dir(conf: dict[str, Any], plan: Plan, started: datetime):
    from runner import rundir

    root, task = conf["output"]["root"], conf["task"]["name"]
    hc = HydraConfig.get() if HydraConfig.initialized() else None
    if hc is not None and hc.mode == RunMode.MULTIRUN:
        if _state["sweep_dir"] is None:
            sweep = rundir.create_sweep_dir(root, started)
            _state["sweep_dir"] = sweep
            print(f"ddp-run: sweep directory {sweep}", flush=True)
        name = f"{hc.job.num}_{task}_w{plan.world_size}"
        return rundir.create_run_dir(root, task, plan.world_size, started, parent=_state["sweep_dir"], name=name)
    return rundir.create_run_dir(root, task, plan.world_size, started)


@hydra.main(version_base=None, config_path=str(CONF_DIR), config_name="config")
def _app(cfg: DictConfig) -> None:
    code = execute(cfg)
    if code == layout.EXIT_REFUSED and not (HydraConfig.initialized() and
                                           HydraConfig.get().mode == RunMode.MULTIRUN):
        sys.exit(code)
    _state["exit"] = max(_state["exit"], code)


def _skip_mode_probe() -> None:
    """Hydra composes the config twice per launch, once only to read ``hydra.mode``. Our config never sets
    it, so outside ``-m`` the probe is skipped: ~50 ms of start-up, which matters for short runs."""
    from hydra._internal.hydra import Hydra

    if hasattr(Hydra, "get_mode"):
        Hydra.get_mode = lambda self, config_name, overrides: None  # None = decided by --multirun alone


def main() -> None:
    """Console entry point of ``ddp-run``."""
    args = sys.argv[1:]
    check_group_overrides(args)
    if not {"-m", "--multirun"} & set(args) and not any(a.startswith("hydra.mode=") for a in args):
        _skip_mode_probe()
    _app()
    sys.exit(_state["exit"])


if __name__ == "__main__":
    main()
