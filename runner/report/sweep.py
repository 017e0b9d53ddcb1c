"""A sweep's own record: which values each job swept, how it ended, its headline figures.

Written by the driver at the end of ``ddp-run -m …`` into the sweep directory as ``sweep.json`` and a short
``sweep.md``, beside Hydra's own ``multirun.yaml``. A refused or failed job never stops the others, and is listed.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

from ddp_runner.contract import layout, secrets

SWEEP_JSON = "sweep.json"
SWEEP_MD = "sweep.md"
HYDRA_RECORD = "multirun.yaml"


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


def markdown(jobs: Sequence[Mapping[str, Any]], keys: Sequence[str], command: Sequence[str]) -> str:
    """sweep.md: one line per job with its swept values, status and headline figures."""
    head = ["job", *keys, "status", "global batch", "throughput", "final loss", "run directory / reason"]
    lines = [f"# Sweep: `{' '.join(command)}`", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for j in jobs:
        h = j.get("figures") or {}
        lines.append("| " + " | ".join([
            str(j["job"]), *(str(j["values"].get(k, "")) for k in keys), j["status"],
            str(h.get("global_batch") or "—"),
            _throughput(h),
            f"{h['final_loss']:.4f}" if h.get("final_loss") is not None else "—",
            str(j.get("run_dir") or j.get("reason") or "")]) + " |")
    failed = [j for j in jobs if j["status"] != "completed"]
    lines += ["", f"{len(jobs) - len(failed)} of {len(jobs)} jobs completed."
              + (f" Not completed: {', '.join(str(j['job']) for j in failed)}." if failed else ""),
              "Compare them with: ddp-compare <this directory>"]
    return "\n".join(lines) + "\n"


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

    def directory(self, root: str, now: datetime) -> str:
        """The sweep directory under ``root``, made on first use."""
        from ddp_runner.rundir.run_dir import create_sweep_dir

        self.root = root
        if self.sweep_dir is None:
            self.sweep_dir = create_sweep_dir(root, now)
            print(f"ddp-run: sweep directory {self.sweep_dir}", flush=True)
        return self.sweep_dir

    def add(self, num: int, overrides: Sequence[str], code: int, run_dir: str | None, reason: str | None,
            refused: bool) -> None:
        """Remember how job ``num`` ended (refused, not run, or its run directory's status and figures)."""
        record: dict[str, Any] = {"job": num, "values": job_values(overrides, self.swept),
                                  "overrides": list(overrides), "exit_code": code}
        if run_dir is None:
            record.update(status="refused" if refused else "not run", reason=reason)
        else:
            summary = _read_json(layout.join(run_dir, layout.SUMMARY))
            record["run_dir"] = run_dir
            record["status"] = ((summary or {}).get("status")
                                or (_read_json(layout.join(run_dir, layout.MANIFEST)) or {}).get("status")
                                or "failed")
            record["figures"] = headline(summary)
        self.jobs.append(record)

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
            masked = partial(secrets.redact, secrets=secrets.KNOWN)  # no secret of the config on disk (issue 30)
            fs.pipe_file(layout.join(base, SWEEP_JSON), masked(json.dumps(
                {"command": self.argv, "swept": self.swept, "jobs": self.jobs}, indent=2, default=str)).encode())
            fs.pipe_file(layout.join(base, SWEEP_MD), masked(markdown(self.jobs, self.swept, self.argv)).encode())
            record = Path(self.hydra_dir or "", HYDRA_RECORD)
            if self.hydra_dir and record.is_file():
                fs.pipe_file(layout.join(base, HYDRA_RECORD), masked(record.read_text()).encode())
            done = sum(r["status"] == "completed" for r in self.jobs)
            print(f"ddp-run: sweep: {done} of {len(self.jobs)} jobs completed; {layout.join(base, SWEEP_MD)}",
                  flush=True)
        except (OSError, PlanError) as exc:
            print(f"ddp-run: warning: the sweep record could not be written ({exc})", file=sys.stderr, flush=True)
        finally:
            if self.hydra_dir:
                shutil.rmtree(self.hydra_dir, ignore_errors=True)


def _read_json(url: str) -> Any:
    """A JSON file of the run tree, None when it is absent or unreadable."""
    import fsspec

    try:
        with fsspec.open(url, "r") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None
