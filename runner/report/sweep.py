"""A sweep's own record: which values each job swept, how it ended, its headline figures.

Written by the driver at the end of ``ddp-run -m …`` into the sweep directory as ``sweep.json`` and a short
``sweep.md``, beside Hydra's own ``multirun.yaml``. A refused or failed job never stops the others, and is listed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

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
