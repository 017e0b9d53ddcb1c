"""``ddp-run``: compose (Hydra) → plan → run tree → torchrun → summary. The driver never trains."""

from __future__ import annotations

import importlib.util
import io
import os
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

from runner.config.plan import Plan, make_plan
from runner.config.probe import Probe, ProbeError
from runner.contract import layout
from runner.contract.errors import PlanError
from runner.diagnostics import setup as diagnostics

# The configs ship inside the package (conf/ in the checkout): found from any working directory. A checkout used
# without installing it (PYTHONPATH=<checkout>) reads its conf/ directly.
CONFIG_PATH = ("pkg://ddp_runner_conf" if importlib.util.find_spec("ddp_runner_conf") is not None
               else str(Path(__file__).resolve().parent.parent / "conf"))
# Hydra writes nothing of its own and never changes directory, whichever primary config is composed (a run
# directory's saved config.yaml, rerun with --config-dir, has no hydra section of its own).
HYDRA_QUIET = ("hydra.output_subdir=null", "hydra.run.dir=.", "hydra.sweep.dir=.", "hydra.sweep.subdir=.",
               "hydra.job.chdir=false", "hydra/job_logging=none", "hydra/hydra_logging=none")

# Worst exit code over the jobs of this invocation (a sweep runs several in one process).
_state: dict[str, Any] = {"exit": 0, "sweep_dir": None, "argv": None, "jobs": 0, "stderr": None,
                          "swept": [], "records": [], "job": {}}


def refuse(err: PlanError) -> int:
    """Print a refusal the user can act on; return the refusal exit code."""
    _state["job"]["reason"] = f"refused: {err.key}={err.value!r}: {err.problem}"
    print(f"ddp-run: refused: {err.key}={err.value!r}: {err.problem}.\n"
          f"  key:   {err.key}\n  value: {err.value!r}\n  fix:   {err.fix}\n"
          "Nothing was started and no run directory was created.", file=sys.stderr)
    return layout.EXIT_REFUSED



def _start_probe(cfg: dict[str, Any], task_dir: str | None) -> Probe | None:
    """The driver's torch probe for this config, started now (None when nothing needs torch's answers)."""
    from runner.config import inductor_settings, memory_plan, task_module
    from runner.contract.rules import flatten

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


def _plan(cfg: dict[str, Any], task_dirs: list[str]) -> tuple[Plan, str | None, Probe | None]:
    """The plan for a composed config (refusing it with PlanError), the directory the workers must search for
    the task module (None when it is installed), and the driver's probe (see runner/config/probe.py), already started.
    ``task_dirs``: where else to look (a continued run's)."""
    from runner.config import task_module, validate
    from runner.config.devices import visible_gpus
    from runner.data import prep as data_prep

    validate.check(cfg)  # every engine and data key from the config alone, before files, tasks or devices
    for line in validate.warnings(cfg):
        print(f"ddp-run: warning: {line}", file=sys.stderr, flush=True)
    task_dir = task_module.locate(cfg["task"].get("module"), extra=task_dirs)
    probe = _start_probe(cfg, task_dir)  # torch's answers come in while the checks below run
    try:
        gpus = visible_gpus() if cfg["device"] != "cpu" else []
        train_samples = data_prep.prepare(cfg["data"], cfg["task"])
        task_module.run_checks(cfg, task_dir)
        data_file = cfg["data"].get("path") if cfg["data"].get("name") == "text" else None
        plan = make_plan(cfg, gpus, train_samples=train_samples, data_file=data_file,
                         inductor_settings=_inductor_defaults(probe))
        if cfg["launcher"].get("name") in ("multinode", "slurm"):
            from runner.launch.registry import launcher_check

            launcher_check(cfg["launcher"], str(cfg["output"]["root"]))
        diagnostics.resolve(cfg)
        diagnostics.check(cfg, plan.world_size)
    except BaseException:  # refused (or interrupted): the probe must not outlive the driver
        if probe is not None:
            probe.cancel()
        raise
    # The resolved config holds what the plan decided: workers run exactly this.
    cfg["batch"]["accumulation"] = plan.accumulation
    cfg["device"], cfg["backend"], cfg["world_size"] = plan.device, plan.backend, plan.world_size
    return plan, task_dir, probe


def _inductor_defaults(probe: Probe | None) -> dict[str, Any] | None:
    """The defaults of the ``train.inductor`` settings torch has (None: none were set)."""
    if probe is None or "inductor" not in probe.want:
        return None
    try:
        return probe.result()["inductor"]
    except ProbeError as exc:
        raise PlanError("train.inductor", "…", f"torch._inductor.config could not be read ({exc})",
                        "check that torch imports in this environment, or leave train.inductor out") from exc


def execute(cfg: DictConfig) -> int:
    """One job: plan, refuse or launch, supervise, summarise. Returns the job's exit code."""
    from runner.config.plan import node_range as plan_node_range
    from runner.data import prep as data_prep
    from runner.launch import finalize, local, multinode
    from runner.launch.command import Supervisor, torchrun_command, worker_env
    from runner.rundir import run_dir as rundir
    from runner.rundir.heartbeat import Heartbeat
    from runner.rundir.mirror import Mirror

    t0 = time.time()
    started = datetime.now()
    resume = str(cfg.resume)
    task_dirs: list[str] = []
    rd = None
    try:
        continuing = resume not in ("auto", "never") and _is_run_dir(resume)
        if continuing:  # continue that run in place, with its own config (its own `resume` too: workers
            # take the run's own newest checkpoint first and fall back to where the run started from)
            rd = rundir.open_run_dir(resume)
            with rd.fs.open(layout.join(rd.path, layout.CONFIG)) as f:
                conf = OmegaConf.to_container(OmegaConf.create(f.read().decode()), resolve=True)
            conf["dry_run"] = bool(cfg.dry_run)
            if diagnostics.without_fault(conf):  # a rehearsal fault strikes once, not again in the continued run
                print("ddp-run: note: the run's fault.* is not repeated when it is continued", file=sys.stderr)
            _warn_ignored_overrides(rd.url)
            previous = rd.read_json(layout.MANIFEST)
            _check_no_live_driver(rd.url, previous)
            from runner.rundir.lease import take_or_refuse

            rd.lease = take_or_refuse(rd.fs, rd.path, rd.url)  # held until this driver exits
            recorded = previous.get("invocation", {}).get("task_dir")
            task_dirs = [recorded] if recorded else []
        else:
            conf = OmegaConf.to_container(cfg, resolve=True)
            if HydraConfig.initialized():
                from runner.config import overrides

                overrides.check_composed(HydraConfig.get().overrides.task, conf)
        plan, task_dir, probe = _plan(conf, task_dirs)
        try:
            if not continuing and resume not in ("auto", "never"):
                _check_resume_source(resume, plan)
            from runner.config import memory_plan

            memory = memory_plan.check(conf, plan, probe)  # refuses a plan that does not fit (PlanError)
        finally:
            if probe is not None:
                probe.cancel()
    except PlanError as err:
        if rd is not None and rd.lease is not None:  # refused after taking the lease: give it back now
            rd.lease.release()
        return refuse(err)

    task = conf["task"]["name"]
    print(f"ddp-run: {task}: {plan.explanation}; device {plan.device}, backend {plan.backend}", flush=True)
    if memory is not None:
        print(f"ddp-run: {memory_plan.describe(memory)}", flush=True)
        if (tight := memory_plan.tight(memory)) is not None:
            print(f"ddp-run: warning: {tight}", file=sys.stderr, flush=True)
    if conf["dry_run"]:
        cmd = torchrun_command(plan, conf["launcher"], "<run dir>")
        print("ddp-run: dry run, nothing launched. Command:\n  " + shlex.join(cmd))
        print(OmegaConf.to_yaml(OmegaConf.create({"plan": plan.to_manifest(), layout.MANIFEST_MEMORY_PLAN: memory})))
        if continuing and rd.lease is not None:
            rd.lease.release()
        return 0

    if conf["output"].get("private"):
        # Everything this driver, torchrun and the workers create from here on (they inherit the umask) is
        # owner-only: the run directory, logs, TensorBoard files, checkpoints.
        os.umask(0o077)
    launcher = conf["launcher"]
    multi = launcher.get("name") == "multinode" and not continuing
    if multi:  # every node computes the same run directory; node 0 opens it, the others join it
        from runner.launch import multinode

        try:
            rd, continuing = _open_multinode_dir(conf, plan)
        except PlanError as err:
            return refuse(err)
        if rd is None:
            url = multinode.run_url(conf, plan)
            try:
                rd = multinode.wait_to_join(url, str(conf["output"]["root"]), launcher.get("join_timeout_s", 120))
            except PlanError as err:
                return refuse(err)
            env = worker_env(rd.url, rd.local, t0, restarts=launcher.get("max_restarts", 0), task_path=task_dir,
                             extra=multinode.env(launcher))
            env.update(diagnostics.worker_env(conf, plan.backend))
            return multinode.follow(rd, plan, launcher, env, conf)
    elif not continuing:
        try:
            rd = _new_run_dir(conf, plan, started)
        except PlanError as err:
            return refuse(err)
    staged = rundir.prepare_continue(rd) if continuing else {}
    if probe is not None:
        probe.keep()  # the next job with this task and model skips the probe
    cmd = torchrun_command(plan, conf["launcher"], rd.url)
    rd.write_text(layout.CONFIG, OmegaConf.to_yaml(OmegaConf.create(conf)))
    from runner.diagnostics.doctor import cheap_report
    from runner.rundir.manifest import initial_manifest

    manifest = initial_manifest(plan, cmd, task, started, invocation=_invocation(task_dir),
                                data=data_prep.describe(conf["data"]))
    manifest["doctor"] = cheap_report(gpu=plan.device == "cuda")  # the preflight checks that cost no time
    manifest[layout.MANIFEST_MEMORY_PLAN] = memory
    if continuing:
        previous = rd.read_json(layout.MANIFEST)
        manifest["started"] = previous.get("started", manifest["started"])
        manifest["continued"] = previous.get("continued", []) + [started.isoformat(timespec="seconds")]
    rd.write_json(layout.MANIFEST, manifest)
    print(f"ddp-run: run directory {rd.url}", flush=True)
    if launcher.get("name") == "slurm":  # the job's own driver runs torchrun; this one submits and follows
        from runner.launch import slurm

        _state["job"]["run_dir"] = rd.url
        try:
            return slurm.submit_and_follow(rd, manifest, launcher, task)
        except PlanError as err:
            rd.remove()
            _state["job"].pop("run_dir")
            return refuse(err)

    from runner.diagnostics.watchdog import Watchdog

    extra = multinode.env(launcher) if multi else local.env() if launcher.get("name", "local") == "local" else {}
    env = worker_env(rd.url, rd.local, t0, restarts=launcher.get("max_restarts", 0), task_path=task_dir,
                     extra=extra)
    env.update(diagnostics.worker_env(conf, plan.backend))
    diagnostics.prepare(rd.local, conf)
    node = multinode.node_name(launcher) if multi else None
    if multi:
        record = multinode.node_start(plan, launcher, node, cmd)
        multinode.write_node(rd, node, record)
    sup = Supervisor(cmd, env, str(Path(rd.local, layout.node_agent_log(node) if multi else layout.AGENT_LOG)))
    mirror = Mirror(rd, staged=staged) if rd.is_remote else None
    _state["job"]["run_dir"] = rd.url
    peers = None
    if multi and rd.is_remote:  # the other nodes' ranks write on their own disks: read their mirrored copies
        from runner.diagnostics.peers import PeerRanks

        peers = PeerRanks(rd)
        peers.reset()
    watch = Watchdog(rd.local, rd.url, plan.world_size, float(conf.get("watchdog", {}).get("timeout_s") or 0),
                     lambda: sup.proc, nccl=plan.backend == "nccl", peers=peers)
    ticks = [Heartbeat(rd, manifest).tick, watch.tick, *([mirror.tick] if mirror else []),
             _lease_tick(rd.lease)]
    launched = time.time()
    rc = sup.run(on_tick=lambda: [tick() for tick in ticks])
    if rd.lease is not None and rd.lease.lost:  # another driver owns the directory now: its run.json is its own
        print(f"ddp-run: FAILED: lost the lease on {rd.url} to another driver; run.json left to it",
              file=sys.stderr, flush=True)
        return 1
    watch.tick(judge=False)  # processes that ended since the last tick
    diagnostics.tidy(rd.local)
    if multi:
        multinode.write_node(rd, node, multinode.node_end(record, rc, sup.interrupted))
        nodes = multinode.collect(rd, plan_node_range(conf)[0])
        try:  # a remote root: the other nodes' ranks wrote their facts on their own hosts, mirrored since
            multinode.gather(rd, launched)
        except Exception as exc:  # noqa: BLE001 - judged then from this node's ranks alone: said, not raised
            print(f"ddp-run: warning: could not read the other nodes' rank files from {rd.url}: {exc}",
                  file=sys.stderr, flush=True)
        plan = multinode.elastic_plan(rd, plan, launcher)
    code = finalize.finish(rd, manifest, plan, rc, sup.interrupted, watch=watch.observations())
    if multi:
        multinode.blame(rd, manifest, nodes)
    if rd.lease is not None:
        rd.lease.release()
    if mirror:
        mirror.flush()
    print(rd.url, flush=True)
    return code


def _lease_tick(held: Any) -> Any:
    """The supervisor's tick for the lease: renew it; once it is lost, stop the workers (SIGTERM to this
    driver, handled as Ctrl-C is) so that only the new holder writes the directory."""
    import signal

    def tick() -> None:
        if held is None or held.lost:
            return
        held.refresh()
        if held.lost:
            os.kill(os.getpid(), signal.SIGTERM)

    return tick


def _open_multinode_dir(conf: dict[str, Any], plan: Plan) -> tuple[Any, bool]:
    """Node 0 of a multi-node run: create its run directory, or continue it when it already holds the run (a
    restart of the same command), holding its lease. Returns (run dir, continuing); (None, False) on the other
    nodes, and, with elastic ranks (``launcher.node_rank=null``, several drivers on the endpoint's host), on
    every driver but the one that took the lease first: exactly one driver opens the run directory."""
    from runner.launch import multinode
    from runner.rundir import run_dir as rundir
    from runner.rundir import status

    launcher = conf["launcher"]
    if not multinode.is_creator(launcher):
        return None, False
    elastic = launcher.get("node_rank") is None
    url = multinode.run_url(conf, plan)
    rdzv_id = str(launcher["rdzv_id"])
    try:
        again = multinode.exists(url)
    except (OSError, ValueError) as exc:
        raise PlanError("output.root", conf["output"]["root"], f"cannot be reached ({type(exc).__name__}: {exc})",
                        "give every node the same output.root on a filesystem they all mount") from exc
    try:
        if not again:
            return multinode.create(url, rdzv_id), False
        rd = rundir.open_run_dir(url)
        previous = rd.read_json(layout.MANIFEST)
        if elastic and status.status_of(previous) == layout.STATUS_RUNNING:
            raise multinode.Held("launcher.rdzv_id", rdzv_id, "opened by another driver", "")
        _check_no_live_driver(rd.url, previous)
        multinode.take_lease(rd, rdzv_id)  # held until this driver exits, as a local run's driver holds its own
    except multinode.Held:
        if not elastic:
            raise
        # Another driver of this job (launcher.node_rank=null) opened it first: this one joins as another node.
        print(f"ddp-run: another driver of this job opened {url} first: joining it", flush=True)
        return None, False
    print(f"ddp-run: {url} holds this run already: continuing it (resume from its newest checkpoint)", flush=True)
    return rd, True


def _invocation(task_dir: str | None) -> dict[str, Any]:
    """How this run was asked for, so that it can be reproduced: the command line, the overrides, the task
    preset and where the task module was found."""
    hc = HydraConfig.get() if HydraConfig.initialized() else None
    return {
        "argv": _state["argv"] or ["ddp-run", *sys.argv[1:]],
        "cwd": os.getcwd(),
        "overrides": list(hc.overrides.task) if hc else [],
        "task_preset": hc.runtime.choices.get("task") if hc else None,
        "config_name": hc.job.config_name if hc else None,
        "config_sources": [s.path for s in hc.runtime.config_sources if s.provider not in ("hydra", "schema")]
        if hc else [],
        "task_dir": task_dir,
        # This job's value of each key the sweep varies (TensorBoard's HPARAMS table shows them).
        "swept": _swept_values(hc),
    }


def _swept_values(hc: Any) -> dict[str, str]:
    if hc is None or hc.mode != RunMode.MULTIRUN:
        return {}
    from runner.report import sweep

    return sweep.job_values(hc.overrides.task, _state["swept"])


def _is_run_dir(url: str) -> bool:
    import fsspec

    try:
        fs, path = fsspec.core.url_to_fs(url)
        return fs.exists(layout.join(path, layout.CONFIG)) and fs.exists(layout.join(path, layout.MANIFEST))
    except (OSError, ValueError, ImportError) as exc:
        raise PlanError("resume", url, f"cannot be read ({type(exc).__name__}: {exc})",
                        "use resume=auto, resume=never, a run directory or a checkpoints/step_<N> path") from exc


def _check_no_live_driver(run_url: str, manifest: dict[str, Any]) -> None:
    """One writer per run directory: refuse to continue a run whose driver is still alive (runner/rundir/status.py);
    a ``lost`` one (its driver killed or its host gone) may be continued."""
    from runner.rundir import status

    if status.status_of(manifest) == layout.STATUS_RUNNING:
        who = status.describe_driver(manifest)
        raise PlanError("resume", run_url, f"is still running: its driver is {who}; one driver per run directory",
                        f"wait for it to end, or stop it (Ctrl-C, or kill -INT {manifest['driver'].get('pid')}"
                        f" on {manifest['driver'].get('host')}) and resume then")


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
        # A checkpoint counts only once its commit marker exists (see tasks/engine/checkpoint/storage.py), and
        # loads only if its state.pt has the size meta.json records (the workers check its sha256 too). A
        # checkpoint named explicitly must pass; of a directory's, one must (the workers take the newest that does).
        if fs.exists(layout.join(path, layout.CKPT_MARKER)):
            run = path.rsplit("/", 2)[0]  # <run>/checkpoints/step_<N>
            if problem := _checkpoint_size_problem(fs, path):
                raise PlanError("resume", resume, f"fails its integrity check: {problem}",
                                "resume from an older checkpoints/step_<N>, or from the run directory (its newest"
                                " checkpoint that passes is taken)")
        elif markers := fs.glob(layout.join(path, "step_*", layout.CKPT_MARKER)):
            run = path.rsplit("/", 1)[0]  # <run>/checkpoints
            problems = [p for m in markers if (p := _checkpoint_size_problem(fs, m.rsplit("/", 1)[0]))]
            if len(problems) == len(markers):
                raise PlanError("resume", resume, "holds no checkpoint that passes its integrity check: "
                                + "; ".join(problems), fix)
        else:
            raise PlanError("resume", resume, "holds no complete checkpoint (no step_<N>/meta.json)", fix)
        manifest = layout.join(run, layout.MANIFEST)
        theirs = json.loads(fs.cat_file(manifest)).get("plan", {}) if fs.exists(manifest) else {}
        ws, global_batch = theirs.get("world_size"), theirs.get("global_batch")
    except PlanError:
        raise
    except (OSError, ValueError, ImportError) as exc:
        raise PlanError("resume", resume, f"cannot be read ({type(exc).__name__}: {exc})", fix) from exc
    # Another world size reshards (the data order carries over: the sampler's strided split consumes a prefix of
    # each epoch); another global batch would be another optimisation problem.
    if ws is not None and ws != plan.world_size and global_batch != plan.global_batch:
        raise PlanError("world_size", plan.world_size,
                        f"the checkpoint's run used world_size={ws} and global batch {global_batch}, this plan's"
                        f" global batch is {plan.global_batch}",
                        f"resume with world_size={ws}, or keep the global batch: batch.global={global_batch}")


def _checkpoint_size_problem(fs: Any, ckpt_dir: str) -> str | None:
    """Why a committed checkpoint cannot load, as far as the driver checks (meta.json readable, state.pt of the
    recorded size); None when it passes. The driver never hashes: the workers verify sha256 when they load."""
    import json

    name = ckpt_dir.rstrip("/").rsplit("/", 1)[-1]
    try:
        expected = json.loads(fs.cat_file(layout.join(ckpt_dir, layout.CKPT_MARKER))).get("bytes")
        size = fs.size(layout.join(ckpt_dir, layout.CKPT_STATE))
    except FileNotFoundError:
        return f"{name}: {layout.CKPT_STATE} is missing"
    except (ValueError, AttributeError):
        return f"{name}: {layout.CKPT_MARKER} is not valid"
    if size != expected:
        return f"{name}: {layout.CKPT_STATE} is {size} bytes, {layout.CKPT_MARKER} says {expected}"
    return None


def _new_run_dir(conf: dict[str, Any], plan: Plan, started: datetime):
    from runner.rundir import run_dir as rundir

    root, task = conf["output"]["root"], conf["task"]["name"]
    hc = HydraConfig.get() if HydraConfig.initialized() else None
    if hc is not None and hc.mode == RunMode.MULTIRUN:
        if _state["sweep_dir"] is None:
            sweep = rundir.create_sweep_dir(root, started)
            _state["sweep_dir"] = sweep
            print(f"ddp-run: sweep directory {sweep}", flush=True)
        from runner.report import sweep

        values = sweep.job_values(hc.overrides.task, _state["swept"])
        name = sweep.job_dir_name(hc.job.num, task, plan.world_size, values)
        return rundir.create_run_dir(root, task, plan.world_size, started, parent=_state["sweep_dir"], name=name)
    return rundir.create_run_dir(root, task, plan.world_size, started)


@hydra.main(version_base=None, config_path=CONFIG_PATH, config_name="config")
def _app(cfg: DictConfig) -> None:
    sys.stderr.write(_restore_stderr())  # what Hydra said while composing (warnings), now that it succeeded
    _state["jobs"] += 1
    _state["job"] = {"root": cfg.output.root}
    code = execute(cfg)
    if HydraConfig.get().mode == RunMode.MULTIRUN:
        _record_job(code)
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


def version() -> str:
    """This package's version."""
    import importlib.metadata

    try:
        return importlib.metadata.version("ddp-runner")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


def main() -> None:
    """Console entry point of ``ddp-run``."""
    from runner.config import overrides

    args = sys.argv[1:]
    _state["argv"] = ["ddp-run", *args]
    if "--version" in args:
        print(f"ddp-run {version()}")
        sys.exit(0)
    cli = overrides.parse(args)
    config_path = CONFIG_PATH
    try:
        if cli.config_dir is not None:
            args, config_path = overrides.user_dir_first(args, cli.config_dir, cli.config_name, CONFIG_PATH)
            cli = overrides.parse(args)
        if cli.multirun:
            overrides.check_sweep_groups(cli, config_path)
    except PlanError as err:
        sys.exit(refuse(err))
    given = {a.split("=", 1)[0] for a in cli.overrides}
    quiet = [o for o in HYDRA_QUIET if o.split("=", 1)[0] not in given]
    if cli.multirun:
        import tempfile

        from hydra.core.override_parser.overrides_parser import OverridesParser

        from runner.report import sweep

        _state["swept"] = sweep.swept_keys(OverridesParser.create().parse_overrides(cli.overrides))
        # Hydra's own record of the sweep (multirun.yaml) goes to a private folder, then into the sweep directory.
        _state["hydra_dir"] = tempfile.mkdtemp(prefix="ddp-run-sweep-")
        quiet = [o if not o.startswith("hydra.sweep.dir=") else f"hydra.sweep.dir={_state['hydra_dir']}"
                 for o in quiet]
    sys.argv = [sys.argv[0], *args, *quiet]
    if not cli.multirun and not any(a.startswith("hydra.mode=") for a in args):
        _skip_mode_probe()
    # Hydra reports a config it cannot compose with exit code 1 and its own text; held back here, and turned
    # into a refusal (exit 2) that names the key and the fix. _app restores stderr as soon as a job starts.
    _state["stderr"], sys.stderr = sys.stderr, io.StringIO()
    try:
        _app()
    except SystemExit as exc:
        held = _restore_stderr()
        if _state["jobs"] or exc.code != 1 or cli.info:  # only a failed composition is turned into a refusal
            sys.stderr.write(held)
            raise
        err = overrides.diagnose(cli, config_path)
        if err.key == "overrides" and held.strip():
            err = PlanError(err.key, err.value, held.strip().splitlines()[0], err.fix)
        sys.exit(refuse(err))
    finally:
        _restore_stderr()
        if cli.multirun:
            _write_sweep_record()
    sys.exit(_state["exit"])


def _record_job(code: int) -> None:
    """Remember how this job of the sweep ended (refused, failed or completed) and its headline figures."""
    import json

    import fsspec

    from runner.report import sweep

    hc = HydraConfig.get()
    job = _state["job"]
    record: dict[str, Any] = {"job": hc.job.num, "values": sweep.job_values(hc.overrides.task, _state["swept"]),
                              "overrides": list(hc.overrides.task), "exit_code": code}
    if "run_dir" not in job:
        record.update(status="refused" if code == layout.EXIT_REFUSED else "not run", reason=job.get("reason"))
    else:
        record["run_dir"] = job["run_dir"]
        try:
            with fsspec.open(layout.join(job["run_dir"], layout.SUMMARY), "r") as f:
                summary = json.load(f)
        except (OSError, ValueError):
            summary = None
        record["status"] = (summary or {}).get("status") or _manifest_status(job["run_dir"])
        record["figures"] = sweep.headline(summary)
    _state["records"].append(record)


def _manifest_status(run_dir: str) -> str:
    """A job's status from its run.json when it has no summary yet (e.g. queued on Slurm); "failed" if unreadable."""
    import json

    import fsspec

    try:
        with fsspec.open(layout.join(run_dir, layout.MANIFEST), "r") as f:
            return str(json.load(f).get("status") or "failed")
    except (OSError, ValueError):
        return "failed"


def _write_sweep_record() -> None:
    """sweep.json, sweep.md and Hydra's multirun.yaml into the sweep directory (made now if every job was
    refused, so that the refusals leave a trace)."""
    import json
    import shutil

    import fsspec

    from runner.report import sweep
    from runner.rundir import run_dir as rundir

    records, hydra_dir = _state["records"], _state.get("hydra_dir")
    try:
        if not records:
            return
        root = _state["job"].get("root")
        if _state["sweep_dir"] is None:
            _state["sweep_dir"] = rundir.create_sweep_dir(str(root), datetime.now())
        fs, _ = fsspec.core.url_to_fs(str(root))
        base = _state["sweep_dir"]
        command = _state["argv"] or ["ddp-run"]
        fs.pipe_file(layout.join(base, sweep.SWEEP_JSON), json.dumps(
            {"command": command, "swept": _state["swept"], "jobs": records}, indent=2, default=str).encode())
        fs.pipe_file(layout.join(base, sweep.SWEEP_MD), sweep.markdown(records, _state["swept"], command).encode())
        record = Path(hydra_dir or "", sweep.HYDRA_RECORD)
        if hydra_dir and record.is_file():
            fs.put_file(str(record), layout.join(base, sweep.HYDRA_RECORD))
        done = sum(r["status"] == "completed" for r in records)
        print(f"ddp-run: sweep: {done} of {len(records)} jobs completed; {layout.join(base, sweep.SWEEP_MD)}",
              flush=True)
    except (OSError, PlanError) as exc:
        print(f"ddp-run: warning: the sweep record could not be written ({exc})", file=sys.stderr, flush=True)
    finally:
        if hydra_dir:
            shutil.rmtree(hydra_dir, ignore_errors=True)


def _restore_stderr() -> str:
    """Put the real stderr back; return what Hydra wrote meanwhile."""
    held = sys.stderr.getvalue() if isinstance(sys.stderr, io.StringIO) else ""
    if _state.get("stderr") is not None:
        sys.stderr, _state["stderr"] = _state["stderr"], None
    return held


if __name__ == "__main__":
    main()
