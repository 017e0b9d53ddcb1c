"""How the jobs of one ``ddp-run -m`` run: one after another in this process, concurrently (``sweep.parallel``,
:mod:`ddp_runner.job.pool`), or submitted to Slurm all at once and followed together
(:mod:`ddp_runner.launch.slurm_sweep`); and what each returns to Hydra (its objective, :mod:`ddp_runner.job.objective`).

Hydra's launcher (the basic one, whichever sweeper drives it: the grid sweeper or a search such as Optuna) calls
``ddp-run``'s job function once per job; the function returns at once for a concurrent or a Slurm job, with a
:class:`~ddp_runner.job.objective.Pending` objective, and :meth:`Sweep.finish` waits for the jobs still running
before the sweep's record is written.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from ddp_runner.contract import layout
from ddp_runner.contract.errors import PlanError
from ddp_runner.job import search
from ddp_runner.job.objective import Failed, Pending, returned
from ddp_runner.job.slots import limit
from ddp_runner.report.sweep import SweepRecord, job_dir_name, job_values

NOT_STARTED = "the sweep was stopped before this job started"
JOB_LOGS = "jobs"  # a concurrent sweep's folder of job consoles, in the sweep directory
active: Sweep | None = None  # the sweep of this ddp-run -m, once made


def check(conf: Mapping[str, Any]) -> None:
    """Refuse (PlanError) a concurrent sweep on a launcher that is not one host's (the values of the sweep keys
    are the validation table's)."""
    sweep = conf.get("sweep") or {}
    if limit(sweep.get("parallel")) != 1 and (conf.get("launcher") or {}).get("name") not in ("local", "slurm"):
        raise PlanError("sweep.parallel", sweep.get("parallel"),
                        f"runs jobs side by side on one host's devices, not with launcher="
                        f"{(conf.get('launcher') or {}).get('name')}",
                        "leave sweep.parallel=false for multi-node jobs (launcher=slurm submits every job at once)")


def concurrent(conf: Mapping[str, Any]) -> bool:
    """Is this job one of a concurrent local sweep? (A search's trials always are, one at a time when
    ``sweep.parallel`` is off: the pruner follows them from this process, runner/job/search.py.)"""
    return ((limit((conf.get("sweep") or {}).get("parallel")) != 1 or search.current is not None)
            and (conf.get("launcher") or {}).get("name", "local") == "local" and not conf.get("dry_run"))


def queued(conf: Mapping[str, Any]) -> bool:
    """Is this job submitted to Slurm and followed with the sweep's other jobs?"""
    launcher = conf.get("launcher") or {}
    return launcher.get("name") == "slurm" and bool(launcher.get("wait", True)) and not conf.get("dry_run")


class Sweep:
    """What one ``ddp-run -m`` carries across its jobs besides its record: the pool, the Slurm follower, and
    each job's overrides and outcome."""

    def __init__(self, record: SweepRecord, config_flags: Sequence[str]) -> None:
        self.record = record
        self.config_flags = list(config_flags)
        self.overrides: dict[int, list[str]] = {}
        self.pool: Any = None
        self.follower: Any = None
        self.exit = 0
        global active
        active = self  # a search sweeper (runner/job/search_sweeper.py) finds the sweep it drives here
        search.register()  # hydra/sweeper=ddp_search, before Hydra composes

    def configure(self, conf: Mapping[str, Any]) -> None:
        """The first job's settings of the sweep: where it goes, what its jobs return."""
        sweep = conf.get("sweep") or {}
        if self.record.root is None:
            self.record.root = str(conf["output"]["root"])
            self.record.objective = {"key": str(sweep.get("objective") or "val_loss"),
                                     "direction": str(sweep.get("direction") or "minimize")}

    def unfollowed(self, conf: Mapping[str, Any]) -> None:
        """A Slurm job this driver does not wait for (``launcher.wait=false``): the sweep's record says how to
        follow the sweep."""
        launcher = conf.get("launcher") or {}
        if launcher.get("name") == "slurm" and not launcher.get("wait", True) and not conf.get("dry_run"):
            self.record.follow_hint = ("ddp-run: not waiting (launcher.wait=false): the jobs are queued; follow the"
                                       " sweep with: ddp-runs {sweep}  (sweep.json lists each job's Slurm job id)")

    def identity(self, num: int) -> dict[str, Any]:
        """``invocation.sweep`` of job ``num``'s run.json (the sweep directory exists by then)."""
        return {"id": self.record.name, "dir": self.record.sweep_dir, "job": num}

    def run_dir_maker(self, num: int, how: Any) -> Callable[..., Any]:
        """Where an in-process job's run directory goes: ``<sweep dir>/<job>_<task>_w<ws>_<swept values>``; once
        made, ``how`` (the job's Invocation) is told its sweep."""
        from ddp_runner.rundir.run_dir import create_run_dir

        def make(conf: dict[str, Any], plan: Any, started: datetime) -> Any:
            root, task = conf["output"]["root"], conf["task"]["name"]
            name = job_dir_name(num, task, plan.world_size, how.swept)
            rd = create_run_dir(root, task, plan.world_size, started, parent=self.record.directory(root, started),
                                name=name)
            how.sweep = self.identity(num)
            return rd

        return make

    def directory(self) -> str:
        """The sweep directory, made now if need be."""
        return self.record.directory(str(self.record.root), datetime.now())

    # -- a job run in this process ---------------------------------------------------------------------------------

    def ended(self, num: int, overrides: Sequence[str], outcome: Any, started: float) -> float:
        """Record a job that ran (or was refused) in this process; its objective for Hydra."""
        rec = self.record.add(num, overrides, outcome.code, outcome.run_dir, outcome.reason, outcome.refused,
                              placement={"started": started, "ended": time.time()})
        self.exit = max(self.exit, outcome.code)
        return self._returned(rec)

    def _returned(self, rec: Mapping[str, Any]) -> float | Failed:
        """A recorded job's objective for Hydra, or why it has none."""
        key = self.record.objective["key"]
        why = (f"job {rec['job']}: {rec['reason']}" if rec.get("reason") else f"job {rec['job']} {rec['status']}"
               if rec["status"] != layout.STATUS_COMPLETED else
               f"job {rec['job']} completed without a {key} in its summary.json (sweep.objective={key})")
        return returned(rec["objective"], why)

    # -- concurrent jobs -------------------------------------------------------------------------------------------

    def start(self, num: int, overrides: Sequence[str], conf: Mapping[str, Any]) -> Any:
        """Start job ``num`` as a child ddp-run on its own devices (waiting for them); its pending objective."""
        from ddp_runner.job.pool import Pool, child_argv

        if self.pool is None:
            self.pool = Pool(conf["sweep"].get("parallel"), on_end=self._child_ended,
                             on_poll=search.current.watch if search.current is not None else None)
        self.overrides[num] = list(overrides)
        child = self.pool.start(num, job_values(overrides, self.record.swept), child_argv(self.config_flags, overrides),
                                conf, self.directory())
        if child is None:
            return self._returned(self.record.add(num, overrides, layout.EXIT_REFUSED, None, NOT_STARTED, False))
        return Pending(lambda: self._objective(num, self.pool.wait))

    def _child_ended(self, child: Any) -> None:
        out = child.outcome or {}
        placement = child.placement()
        if out.get("run_dir"):
            facts = _rank_zero_facts(out["run_dir"])
            placement["rdzv_port"] = _int(facts.get("master_port"))
            if facts.get("cpu_affinity") is not None:
                placement["rank0_cpu_affinity"] = facts["cpu_affinity"]
        if search.current is not None and search.current.planned(child.num) is not None:
            placement["planned_steps"] = search.current.planned(child.num)
        rec = self.record.add(child.num, self.overrides[child.num], int(out.get("code", 1)), out.get("run_dir"),
                              out.get("reason"), bool(out.get("refused")), placement=placement)
        self.exit = max(self.exit, int(out.get("code", 1)))
        if search.current is not None:
            search.current.ended(child.num, rec)

    # -- Slurm jobs --------------------------------------------------------------------------------------------------

    def submitted(self, num: int, overrides: Sequence[str], outcome: Any, how: Any) -> Any:
        """Job ``num`` was submitted to Slurm (or refused): its pending objective, followed with the others."""
        from ddp_runner.launch.slurm_sweep import Follower

        if not how.submitted:  # refused before (or by) sbatch
            return self.ended(num, overrides, outcome, time.time())
        rd, job_id = how.submitted[0]
        now = time.time()
        self.overrides[num] = list(overrides)
        self.record.add(num, overrides, 0, rd.url, None, False, placement={"slurm_job": job_id, "submitted": now})
        if self.follower is None:
            self.follower = Follower(on_end=self._slurm_ended)
        self.follower.add(num, job_values(overrides, self.record.swept), rd, job_id, now)
        return Pending(lambda: self._objective(num, self.follower.wait))

    def _slurm_ended(self, e: Any) -> None:
        self.record.add(e.num, self.overrides[e.num], int(e.code or 0), e.rd.url, None, False,
                        placement={"slurm_job": e.job_id, "submitted": e.submitted, "ended": e.ended,
                                   "slurm_state": e.state})
        self.exit = max(self.exit, int(e.code or 0))

    # -- the end ------------------------------------------------------------------------------------------------------

    def _objective(self, num: int, wait: Any) -> float | Failed:
        wait(num)
        return self._returned(next(j for j in self.record.jobs if j["job"] == num))

    def stopped(self) -> bool:
        """Was the sweep stopped (Ctrl-C, SIGTERM): no job is to start."""
        return self.pool is not None and self.pool.stopping is not None

    def settle(self) -> None:
        """Wait for the running concurrent jobs (a search tells its study how each ended before it closes)."""
        if self.pool is not None:
            for num in list(self.pool.running):
                self.pool.wait(num)

    def finish(self) -> None:
        """Wait for every job still running or queued (concurrent, Slurm)."""
        if self.pool is not None:
            self.pool.wait_all()
            self._keep_logs()
        if self.follower is not None:
            self.follower.wait_all()


    def _keep_logs(self) -> None:
        """Each concurrent job's console (its ddp-run's output) into ``<sweep dir>/jobs/job-<N>.log``."""
        import fsspec

        try:
            if self.record.sweep_dir is not None:
                fs, _ = fsspec.core.url_to_fs(str(self.record.root))
                fs.makedirs(layout.join(self.record.sweep_dir, JOB_LOGS), exist_ok=True)
                for num, child in sorted(self.pool.done.items()):
                    fs.put_file(child.files["log"], layout.join(self.record.sweep_dir, JOB_LOGS, f"job-{num}.log"))
        except OSError as exc:
            print(f"ddp-run: warning: the sweep's job logs could not be kept ({exc})", flush=True)
        finally:
            self.pool.close()


def child_run_dir_maker(job: Mapping[str, Any], how: Any) -> Callable[..., Any]:
    """Where a concurrent sweep's job (a child ddp-run, ``job`` its parent's word) makes its run directory: in
    the sweep directory its parent made, named as in-process jobs are."""
    from ddp_runner.rundir.run_dir import create_run_dir

    def make(conf: dict[str, Any], plan: Any, started: datetime) -> Any:
        task = conf["task"]["name"]
        name = job_dir_name(job["num"], task, plan.world_size, job["values"])
        return create_run_dir(conf["output"]["root"], task, plan.world_size, started, parent=job["dir"], name=name)

    how.sweep = {"id": str(job["dir"]).rstrip("/").rsplit("/", 1)[-1], "dir": job["dir"], "job": job["num"]}
    return make


def write_outcome(path: str, outcome: Any) -> None:
    """A concurrent sweep's job tells its parent how it ended (the parent records it in sweep.json)."""
    import json

    from ddp_runner.contract.osutil import atomic_write

    atomic_write(path, json.dumps({"code": outcome.code, "run_dir": outcome.run_dir, "reason": outcome.reason,
                                   "refused": outcome.refused}))


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _rank_zero_facts(run_dir: str) -> dict[str, Any]:
    from ddp_runner.report.sweep import read_json

    return read_json(run_dir, layout.rank_facts(0)) or {}
