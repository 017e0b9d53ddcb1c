"""How the jobs of one ``ddp-run -m`` run: one after another in this process, concurrently (``sweep.parallel``,
:mod:`ddp_runner.job.pool`), or submitted to Slurm all at once and followed together
(:mod:`ddp_runner.launch.slurm_sweep`); and what each returns to Hydra (its objective, :mod:`ddp_runner.job.objective`).

Hydra's launcher (the basic one, whichever sweeper drives it: the grid sweeper or a search such as Optuna) calls
``ddp-run``'s job function once per job; the function returns at once for a concurrent or a Slurm job, with a
:class:`~ddp_runner.job.objective.Pending` objective, and :meth:`Sweep.finish` waits for the jobs still running
before the sweep's record is written.
"""

from __future__ import annotations

import shlex
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from ddp_runner.console import textfit
from ddp_runner.contract import layout, stops
from ddp_runner.contract.errors import PlanError
from ddp_runner.contract.osutil import handle_signals
from ddp_runner.job import search
from ddp_runner.job.objective import Failed, Pending, returned
from ddp_runner.job.slots import limit
from ddp_runner.report.sweep import SweepRecord, job_dir_name, job_values
from ddp_runner.supervise.stop import guard

NOT_STARTED = "the sweep was stopped before this job started"
JOB_LOGS = layout.SWEEP_JOB_LOGS  # a concurrent sweep's folder of job consoles, in the sweep directory
SHOWN_NOT_RUN = 5  # commands of jobs not run printed after a stop (sweep.json lists them all)


class SweepStopped(guard.Stopped):
    """A stop signal came while a job of a sequential sweep ran: no further job starts (a BaseException, as every
    stop: Hydra's launcher lets it by)."""
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
        self.grid: list[list[str]] | None = None  # every job's overrides, when known up front (sweep_plan.py)
        self.planned = False  # the jobs were planned up front (once, at the first job)
        self.refused_early: set[int] = set()
        self.stop_signal: int | None = None
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

    # -- every job, before the first starts ------------------------------------------------------------------------

    def plan_all(self, hc: Any, args: Sequence[str], typed: Sequence[str], dry_run: bool) -> None:
        """At the sweep's first job: learn every job of a grid sweep, and refuse now each one its plan refuses
        (it is recorded, and skipped at its turn: :meth:`decided`)."""
        from ddp_runner.job import sweep_plan
        from ddp_runner.job.invocation import refuse

        if self.planned:
            return
        self.planned = True
        self.grid = sweep_plan.grid_jobs(hc, args, typed)
        if self.grid is None or dry_run:
            return
        for num, err in sorted(sweep_plan.refusals(hc, self.grid, hc.job.num).items()):
            values = " ".join(f"{k}={v}" for k, v in job_values(self.grid[num], self.record.swept).items())
            outcome = refuse(err, f"sweep: before any job starts, job {num} ({values})")
            self.record.add(num, self.grid[num], outcome.code, None, outcome.reason, True)
            self.exit = max(self.exit, outcome.code)
            self.refused_early.add(num)

    def decided(self, num: int) -> float | Failed | None:
        """The objective of job ``num`` when it was refused up front (it is not run again); None otherwise."""
        if num not in self.refused_early:
            return None
        return self._returned(next(j for j in self.record.jobs if j["job"] == num))

    # -- a job run in this process ---------------------------------------------------------------------------------

    def ended(self, num: int, overrides: Sequence[str], outcome: Any, started: float) -> float:
        """Record a job that ran (or was refused) in this process; its objective for Hydra. A stop signal taken
        while it ran ends the sweep (:class:`SweepStopped`)."""
        rec = self.record.add(num, overrides, outcome.code, outcome.run_dir, outcome.reason, outcome.refused,
                              placement={"started": started, "ended": time.time()})
        self.exit = max(self.exit, outcome.code)
        if (signum := guard.received() or _stop_code(outcome.code)) is not None:
            raise SweepStopped(signum)
        return self._returned(rec)

    def stop(self, signum: int) -> None:
        """The sweep was stopped: every job it knows of and did not start is recorded ``not run``; it exits
        128 + the signal, as a single run's stop does."""
        # What is left is the record, written in a moment: a further Ctrl-C must not cut it in two (the entry
        # point's guard puts the handlers back as it ends).
        handle_signals(guard.stop_signals(), signal.SIG_IGN)
        self.stop_signal = signum
        self.exit = 128 + signum
        recorded = {j["job"] for j in self.record.jobs}
        if not recorded:  # stopped before the first job launched: nothing is left behind, as for a single run
            return
        for num, overrides in enumerate(self.grid or []):
            if num not in recorded:
                self.record.add(num, overrides, layout.EXIT_REFUSED, None, NOT_STARTED, False)

    def say_stopped(self) -> None:
        """After a stop: what ended how, and how to go on (the interrupted job's own lines said how to continue
        it; a job not run is run with its overrides)."""
        if self.stop_signal is None:
            return
        jobs = sorted(self.record.jobs, key=lambda j: j["job"])
        name = stops.signal_name(self.stop_signal)
        if not jobs:
            guard.say(f"ddp-run: stopped by {name} before launching: nothing was started")
            return
        stopped = [str(j["job"]) for j in jobs if j["status"] in (layout.STATUS_INTERRUPTED, layout.STATUS_PREEMPTED)]
        not_run = [j for j in jobs if j["status"] == "not run"]
        lines = [f"ddp-run: sweep: stopped by {name}: no further job was started"
                 + (f"; job {', '.join(stopped)} ended interrupted (its lines above say whether and how it"
                    " continues)" if stopped else "")
                 + (f"; not run: job {', '.join(str(j['job']) for j in not_run)}" if not_run else "")]
        lines = textfit.wrap(lines[0], textfit.terminal_width(sys.stderr))  # the commands stay whole: pasted
        if not_run:
            lines.append("ddp-run: sweep: run the jobs not run with:")
            lines += ["  " + shlex.join(["ddp-run", *self.config_flags, *j["overrides"]])
                      for j in not_run[:SHOWN_NOT_RUN]]
            if len(not_run) > SHOWN_NOT_RUN:
                lines.append(f"  and {len(not_run) - SHOWN_NOT_RUN} more (sweep.json lists their overrides)")
        guard.say("\n".join(lines))

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
            textfit.say(f"ddp-run: warning: the sweep's job logs could not be kept ({exc})", flush=True)
        finally:
            self.pool.close()


def new_sweep(argv: Sequence[str], overrides: Sequence[str], config_flags: Sequence[str]) -> Sweep:
    """The sweep of ``ddp-run -m`` with these ``overrides``: its keys swept, and its record, whose folder for Hydra's
    own (multirun.yaml) is a private one until the sweep directory exists."""
    import tempfile

    from hydra.core.override_parser.overrides_parser import OverridesParser

    from ddp_runner.report.sweep import swept_keys

    swept = swept_keys(OverridesParser.create().parse_overrides(list(overrides)))
    return Sweep(SweepRecord(argv, swept, tempfile.mkdtemp(prefix="ddp-run-sweep-")), config_flags)


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


def _stop_code(code: int) -> int | None:
    """The stop signal a job's exit code 128 + N says it ended on (None: it did not end on a stop)."""
    return code - 128 if code - 128 in guard.stop_signals() else None


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _rank_zero_facts(run_dir: str) -> dict[str, Any]:
    from ddp_runner.report.sweep import read_json

    return read_json(run_dir, layout.rank_facts(0)) or {}
