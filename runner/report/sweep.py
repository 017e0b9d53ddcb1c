"""A sweep's own record: which values each job swept, how it ended, its headline figures.

Written by the driver at the end of ``ddp-run -m …`` into the sweep directory as ``sweep.json`` and a short
``sweep.md``, beside Hydra's own ``multirun.yaml``. A refused or failed job never stops the others, and is listed.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import sys
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

from ddp_runner.console import textfit
from ddp_runner.contract import layout, secrets
from ddp_runner.report import sweep_search, sweep_table
from ddp_runner.rundir import records

SWEEP_JSON = "sweep.json"
SWEEP_MD = "sweep.md"
HYDRA_RECORD = "multirun.yaml"
# What a search sweeper leaves in Hydra's sweep folder (Optuna: the best parameters and value), kept beside it.
SWEEPER_RECORDS = (HYDRA_RECORD, "optimization_results.yaml")


def swept_keys(overrides: Sequence[Any]) -> list[str]:
    """The keys (or groups) a command line sweeps, in order: ``world_size=1,2 task=gpt,smoke`` → both."""
    return [o.key_or_group for o in overrides if o.is_sweep_override()]


def job_values(task_overrides: Sequence[str], keys: Sequence[str]) -> dict[str, str]:
    """This job's value of each swept key, from Hydra's per-job overrides (``key=value`` strings)."""
    values: dict[str, str] = {}
    for o in task_overrides:
        key, _, value = o.lstrip("+~").partition("=")
        if key in keys:
            values[key] = value
    return values


def job_dir_name(num: int, task: str, world_size: int, values: Mapping[str, str]) -> str:
    """``<job>_<task>_w<ranks>[_<key>=<value>…]``: jobs that differ in any swept key read apart at a glance.

    World size is already in ``w<ranks>``; characters a path cannot hold become ``-``.
    """
    extra = "".join(f"_{k.split('.')[-1]}={v}" for k, v in values.items() if k != "world_size")
    name = f"{num}_{task}_w{world_size}{extra}"
    return re.sub(r"[^A-Za-z0-9._=+-]", "-", name)[:200]


# Names that are not keys of summary.json as written: the last train loss, and the median figures.
_DERIVED = {"final_loss": lambda s: (s.get("losses") or [None])[-1],
            "tokens_per_s": lambda s: (s.get("median") or {}).get("tokens_per_s"),
            "step_time_s": lambda s: (s.get("median") or {}).get("step_time_s")}


def value_of(summary: Mapping[str, Any] | None, key: str) -> float | None:
    """The objective ``key`` in a run's summary.json: ``val_loss``, ``final_loss``, ``tokens_per_s``,
    ``step_time_s``, a task metric's name (``metrics.<name>``, or the bare name), a ``final`` scalar
    (``perf/step_time_s``), or any dotted path into summary.json. None when the run has no such number."""
    if not summary:
        return None
    found: Any = None
    if key in _DERIVED:
        found = _DERIVED[key](summary)
    else:
        for where in (summary, summary.get("metrics") or {}, summary.get("final") or {}):
            if key in where:
                found = where[key]
                break
        else:
            found = summary
            for part in key.split("."):
                found = found.get(part) if isinstance(found, Mapping) else None
    if isinstance(found, bool) or not isinstance(found, (int, float)) or not math.isfinite(found):
        return None
    return float(found)


# Objectives this close are one value: they print alike (six significant digits) and no run beat the other.
TIE_REL = 1e-6


def top_jobs(jobs: Sequence[Mapping[str, Any]], direction: str) -> list[Mapping[str, Any]]:
    """The jobs sharing the best finite ``objective`` (within :data:`TIE_REL`), by job number; [] when none has one."""
    scored = [j for j in jobs if isinstance(j.get("objective"), (int, float)) and math.isfinite(j["objective"])]
    if not scored:
        return []
    sign = -1.0 if direction == "maximize" else 1.0
    top = min(sign * j["objective"] for j in scored)
    return sorted((j for j in scored if math.isclose(sign * j["objective"], top, rel_tol=TIE_REL)),
                  key=lambda j: j["job"])


def best(jobs: Sequence[Mapping[str, Any]], direction: str) -> Mapping[str, Any] | None:
    """The job with the best finite ``objective``, or None: when no job has one, or several share it (a world-size
    sweep at a fixed global batch gives every job the same losses: naming one of them best would be arbitrary)."""
    top = top_jobs(jobs, direction)
    return top[0] if len(top) == 1 else None


def headline(summary: Mapping[str, Any] | None) -> dict[str, Any]:
    """A job's headline figures from its summary.json."""
    if not summary:
        return {}
    median = summary.get("median") or {}
    losses = summary.get("losses") or []
    step_s, batch = median.get("step_time_s"), summary.get("global_batch")
    return {"tokens_per_s": median.get("tokens_per_s"), "step_time_s": step_s,
            "samples_per_s": batch / step_s if batch and step_s else None,
            "final_loss": losses[-1] if losses else None, "val_loss": summary.get("val_loss"),
            "global_batch": summary.get("global_batch"), "steps": summary.get("steps")}


def markdown(jobs: Sequence[Mapping[str, Any]], keys: Sequence[str], command: Sequence[str],
             objective: Mapping[str, Any] | None = None) -> str:
    """sweep.md: one line per job with its swept values, status, headline figures and objective."""
    name = (objective or {}).get("key")
    head = ["job", *keys, "status", "global batch", "throughput", "final loss", *([f"objective ({name})"] if name
                                                                                  else []), "run directory / reason"]
    lines = [f"# Sweep: `{' '.join(command)}`", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for j in jobs:
        h = j.get("figures") or {}
        lines.append("| " + " | ".join([
            str(j["job"]), *(str(j["values"].get(k, "")) for k in keys), sweep_search.state_text(j),
            str(h.get("global_batch") or "—"),
            _throughput(h),
            f"{h['final_loss']:.4f}" if h.get("final_loss") is not None else "—",
            *([_objective_text(j.get("objective"), j["status"])] if name else []),
            str(j.get("run_dir") or j.get("reason") or "").replace("|", "\\|")]) + " |")  # a refusal's choices
    failed = [j for j in jobs if j["status"] != "completed"]
    lines += ["", f"{len(jobs) - len(failed)} of {len(jobs)} jobs completed."
              + (f" Not completed: {', '.join(str(j['job']) for j in failed)}." if failed else "")]
    if name:
        lines.append(best_line(jobs, objective or {}))
    lines.append("Compare them with: ddp-compare <this directory>")
    return "\n".join(lines) + "\n"


def _objective_text(value: Any, status: str) -> str:
    """The objective, or why there is none (a job that did not complete is a failed trial to a sweeper)."""
    if isinstance(value, (int, float)) and math.isfinite(value):
        return f"{value:.6g}"
    if status == layout.STATUS_PRUNED:
        return "— (pruned)"
    return "— (failed trial)" if status != layout.STATUS_COMPLETED else "— (not in summary.json: failed trial)"


def best_line(jobs: Sequence[Mapping[str, Any]], objective: Mapping[str, Any]) -> str:
    """``Best: job 3 (lr=0.01), val_loss 0.1234 (minimize).``, or why there is none (no objective, or a tie)."""
    top = top_jobs(jobs, str(objective.get("direction", "minimize")))
    if not top:
        return f"Best: none (no job has a {objective.get('key')} to compare)."
    said = f", {objective.get('key')} {top[0]['objective']:.6g} ({objective.get('direction', 'minimize')})."
    if len(top) > 1:
        return "Best: none: jobs " + ", ".join(_job_named(j) for j in top) + " tie" + said
    return f"Best: job {_job_named(top[0])}" + said


def _job_named(job: Mapping[str, Any]) -> str:
    values = " ".join(f"{k}={v}" for k, v in (job.get("values") or {}).items())
    return f"{job['job']}" + (f" ({values})" if values else "")


def trials_markdown(record: Mapping[str, Any]) -> str:
    """The trials of a recorded sweep (its sweep.json) and the best one, for ``ddp-compare``."""
    objective = record.get("objective") or {}
    jobs = record.get("jobs") or []
    key = objective.get("key", "objective")
    lines = [f"## Trials: {key} ({objective.get('direction', 'minimize')})", "",
             "| job | values | status | " + key + " |", "|---|---|---|---|"]
    for j in jobs:
        values = " ".join(f"{k}={v}" for k, v in (j.get("values") or {}).items()) or "—"
        lines.append(f"| {j['job']} | {values} | {sweep_search.state_text(j)} | "
                     f"{_objective_text(j.get('objective'), j['status'])} |")
    found = record.get("search")
    more = sweep_search.markdown_lines(found) if isinstance(found, Mapping) else []
    return "\n".join([*lines, "", best_line(jobs, objective), *more]) + "\n"


def _throughput(figures: Mapping[str, Any]) -> str:
    if figures.get("tokens_per_s"):
        return f"{figures['tokens_per_s']:,.0f} tokens/s"
    if figures.get("samples_per_s"):
        return f"{figures['samples_per_s']:,.1f} samples/s"
    return "—"


class SweepRecord:
    """How each job of one ``ddp-run -m`` ended, and where the sweep's record goes.

    The sweep directory is made when the first job needs a run directory (:meth:`directory`), or at the end when
    every job was refused, so that the refusals leave a trace.
    """

    def __init__(self, argv: Sequence[str], swept: Sequence[str], hydra_dir: str | None) -> None:
        self.argv, self.swept, self.hydra_dir = list(argv), list(swept), hydra_dir
        self.jobs: list[dict[str, Any]] = []
        self.sweep_dir: str | None = None
        self.root: str | None = None
        # What each job returns to Hydra (sweep.objective, sweep.direction), from the first job's config.
        self.objective: dict[str, Any] = {"key": "val_loss", "direction": "minimize"}
        self.follow_hint: str | None = None  # how to follow jobs this driver did not wait for
        self.search: dict[str, Any] | None = None  # an early-stopping search's settings (runner/job/search.py)

    @property
    def name(self) -> str | None:
        """The sweep's id: its directory's name (``2026-12-01/20-30-00_sweep``'s last part), once it exists.
        Every job's run.json records it (``invocation.sweep``): a tracker groups the sweep's runs by it."""
        return self.sweep_dir.rstrip("/").rsplit("/", 1)[-1] if self.sweep_dir else None

    def directory(self, root: str, now: datetime) -> str:
        """The sweep directory under ``root``, made on first use."""
        from ddp_runner.rundir.run_dir import create_sweep_dir

        self.root = root
        if self.sweep_dir is None:
            self.sweep_dir = create_sweep_dir(root, now)
            textfit.say(f"ddp-run: sweep directory {self.sweep_dir}", flush=True)
        return self.sweep_dir

    def add(self, num: int, overrides: Sequence[str], code: int, run_dir: str | None, reason: str | None,
            refused: bool, placement: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Remember how job ``num`` ended (refused, not run, or its run directory's status and figures), and
        its objective; a job recorded before (submitted, not yet followed) is replaced. Returns the record."""
        record: dict[str, Any] = {"job": num, "values": job_values(overrides, self.swept),
                                  "overrides": list(overrides), "exit_code": code}
        summary = None
        if run_dir is None:
            record.update(status="refused" if refused else "not run", reason=reason)
        else:
            summary = read_json(run_dir, layout.SUMMARY)
            manifest = read_json(run_dir, layout.MANIFEST) or {}
            record["run_dir"] = run_dir
            record["status"] = (summary or {}).get("status") or manifest.get("status") or "failed"
            if manifest.get("pruned") is not None:  # a search's pruner stopped it: where, at what value
                record["pruned"] = manifest["pruned"]
            if (manifest.get("slurm") or {}).get("job_id"):
                record["slurm_job"] = manifest["slurm"]["job_id"]
            record["figures"] = headline(summary)
            if reason:
                record["reason"] = reason
        # A search sweeper gets NaN (a failed trial) for a job that did not complete.
        done = record["status"] == layout.STATUS_COMPLETED
        record["objective"] = value_of(summary, self.objective["key"]) if done else None
        record.update(placement or {})
        self.jobs = [j for j in self.jobs if j["job"] != num] + [record]
        return record

    def restore(self) -> None:
        """A continued search: the jobs its sweep.json recorded before (its directory is ``sweep_dir``)."""
        import fsspec

        try:
            fs, path = fsspec.core.url_to_fs(str(self.sweep_dir))
            self.jobs = list(json.loads(fs.cat_file(layout.join(path, SWEEP_JSON))).get("jobs") or [])
        except (OSError, ValueError):
            self.jobs = []

    def write(self) -> None:
        """sweep.json, sweep.md and Hydra's multirun.yaml into the sweep directory; a failure only warns."""
        import fsspec

        from ddp_runner.contract.errors import PlanError

        try:
            if not self.jobs:
                return
            root = str(self.root or "outputs")
            base = self.directory(root, datetime.now())
            fs, _ = fsspec.core.url_to_fs(root)
            jobs = sorted(self.jobs, key=lambda j: j["job"])
            top = top_jobs(jobs, self.objective["direction"])
            objective = {**self.objective, "best": top[0]["job"] if len(top) == 1 else None,
                         **({"tied": [j["job"] for j in top]} if len(top) > 1 else {})}
            masked = partial(secrets.redact, secrets=secrets.KNOWN)  # no secret of the config on disk (issue 30)
            found = sweep_search.summary(jobs, self.search) if self.search is not None else None
            fs.pipe_file(layout.join(base, SWEEP_JSON), masked(json.dumps(
                {"command": self.argv, "swept": self.swept, "objective": objective, "jobs": jobs,
                 **({"search": found} if found else {})}, indent=2, default=str)).encode())
            md = markdown(jobs, self.swept, self.argv, objective)
            if found:
                md += "\n".join(sweep_search.markdown_lines(found)) + "\n"
            fs.pipe_file(layout.join(base, SWEEP_MD), masked(md).encode())
            for name in SWEEPER_RECORDS:
                record = Path(self.hydra_dir or "", name)
                if self.hydra_dir and record.is_file():
                    fs.pipe_file(layout.join(base, name), masked(record.read_text()).encode())
            done = sum(r["status"] == "completed" for r in jobs)
            going = sum(r["status"] in (layout.STATUS_QUEUED, layout.STATUS_RUNNING) for r in jobs)
            width = textfit.terminal_width(sys.stdout)
            closing = [f"ddp-run: sweep: {done} of {len(jobs)} jobs completed" + (f", {going} queued or running"
                                                                                 if going else "")
                       + f"; {layout.join(base, SWEEP_MD)}", *sweep_table.table(jobs, self.swept, objective, width)]
            if top:
                closing.append(f"ddp-run: sweep: {best_line(jobs, objective)}")
            closing += [f"ddp-run: sweep: {line}" for line in (sweep_search.markdown_lines(found) if found else [])]
            print("\n".join(textfit.wrap_all(closing, width)), flush=True)
            if self.follow_hint:
                textfit.say(self.follow_hint.format(sweep=base), flush=True)
        except (OSError, PlanError) as exc:
            textfit.say(f"ddp-run: warning: the sweep record could not be written ({exc})", sys.stderr, flush=True)
        finally:
            if self.hydra_dir:
                shutil.rmtree(self.hydra_dir, ignore_errors=True)


def read_json(run_dir: str, rel: str) -> Any:
    """A JSON record of a job's run directory (``rel``: its path in it), None when it is absent or damaged: the
    sweep's record goes without that job's figures (``ddp-runs`` names the damage)."""
    try:
        return records.read_url(layout.join(run_dir, rel), records.fix_for(rel, run_dir))
    except records.DamagedFile:
        return None
