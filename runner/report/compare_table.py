"""``ddp-compare``'s table: runs grouped by task and throughput unit, their labels, one row per run (efficiency
against the group's baseline, time to the target loss, GPU-hours and cost), the warnings on what does not compare,
and the report as Markdown (the legend under each table: runner/report/legend.py) and CSV."""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from ddp_runner.contract import layout
from ddp_runner.report import legend
from ddp_runner.report.compare_math import (
    EXPECTED_DIFFERENCES,
    bottleneck,
    config_differences,
    cost,
    gpu_hours,
    loss_at_steps,
    scaling_efficiency,
    time_to_target,
)
from ddp_runner.report.compare_runs import Run
from ddp_runner.rundir import records


def labels(runs: Sequence[Run]) -> list[str]:
    """What the report calls each run: a sweep's job by the values it swept (``lr=0.001``; its world size is the
    ranks column), any other run by its directory's name. A label two runs would share gets the ranks
    (``lr=0.01 w2``); one still shared is the directory's name again."""
    out = [" ".join(f"{k.split('.')[-1]}={v}" for k, v in r.swept.items() if k != "world_size") or r.name
           for r in runs]
    twice = {x for x in out if out.count(x) > 1}
    out = [f"{x} w{r.world}" if x in twice and x != r.name else x for x, r in zip(out, runs, strict=True)]
    return [x if out.count(x) == 1 else r.name for x, r in zip(out, runs, strict=True)]


def swept_values(runs: Sequence[Run]) -> dict[str, list[str]]:
    """``{key: [value, …]}``: each key the runs' sweeps varied, with its values in the order the runs have them."""
    out: dict[str, list[str]] = {}
    for r in runs:
        for k, v in r.swept.items():
            if v not in out.setdefault(k, []):
                out[k].append(v)
    return out


COLUMNS = ("run", "label", "group", "device", "status", "world", "global_batch", "rate", "unit", "efficiency",
           "final_loss", "val_loss", "target", "time_to_target_s", "gpu_hours", "cost", "data_share",
           "exposed_sync_share", "rank_gap_pct")


def groups(runs: Sequence[Run]) -> dict[str, list[Run]]:
    """The runs that compare with each other, by task and throughput unit: ``{"smoke (samples/s)": [...]}``.

    Efficiency, time to target and the loss curves mean nothing across tasks, and samples/s against tokens/s is no
    ratio at all. A run with no measured rate (failed early) joins its task's group.
    """
    by_task: dict[str, list[Run]] = {}
    for r in runs:
        by_task.setdefault(r.task or "unknown task", []).append(r)
    out: dict[str, list[Run]] = {}
    for task, members in by_task.items():
        units = sorted({r.unit for r in members if r.rate})
        for unit in units or ["no throughput measured"]:
            out[f"{task} ({unit})"] = [r for r in members if (r.unit if r.rate else (units or [unit])[0]) == unit]
    return out


def _target_for(target: float | Mapping[str, float | None] | None, group: str) -> float | None:
    return target.get(group) if isinstance(target, Mapping) else target


def rows(runs: Sequence[Run], target: float | Mapping[str, float | None] | None, price: float) -> list[dict[str, Any]]:
    """One row per run, grouped (:func:`groups`); in each group the scaling baseline is the completed run with the
    smallest world size among the runs that differ from it only in world size (:func:`baselines`; none where the
    world size does not vary). ``target``: one loss for every group, or one per group. GPU-hours and cost only for
    GPU runs."""
    named = [replace(r, label=x) for r, x in zip(runs, labels(runs), strict=True)]
    out = []
    for group, members in groups(named).items():
        out += _group_rows(group, members, _target_for(target, group), price)
    return out


def baselines(runs: Sequence[Run]) -> dict[int, Run]:
    """The scaling baseline of each run (by ``id``) whose efficiency means something: runs that differ only in world
    size (a sweep's jobs with the same values of its other keys; runs that are no sweep's job, together) form a
    series, and in a series whose completed runs have more than one world size, the completed run with the
    fewest ranks is the baseline of each of its runs. At one world size a throughput ratio is no scaling."""
    series: dict[tuple[tuple[str, str], ...], list[Run]] = {}
    for r in runs:
        series.setdefault(tuple(sorted((k, v) for k, v in r.swept.items() if k != "world_size")), []).append(r)
    out: dict[int, Run] = {}
    for members in series.values():
        done = [r for r in members if r.status == layout.STATUS_COMPLETED and r.rate]
        if len({r.world for r in done}) > 1:
            base = min(done, key=lambda r: r.world)
            out.update({id(r): base for r in members})
    return out


def _group_rows(group: str, runs: Sequence[Run], target: float | None, price: float) -> list[dict[str, Any]]:
    base_of = baselines(runs)
    out = []
    for r in sorted(runs, key=lambda r: (r.world, r.name)):
        base = base_of.get(id(r))
        eff = scaling_efficiency(r.rate, r.world, base.rate, base.world) if base and r is not base else None
        t = time_to_target(loss_at_steps(r.losses, r.log_every, r.steps, r.loss_steps), target, r.step_time_s,
                           r.first_step_s) \
            if target is not None and r.status == layout.STATUS_COMPLETED else None
        hours = gpu_hours(t, r.world) if r.device == "cuda" else None  # a CPU run has no GPU-hours to price
        out.append({
            "run": r.name, "label": r.label or r.name, "group": group, "task": r.task, "device": r.device,
            "status": r.status, "world": r.world, "global_batch": r.global_batch, "rate": r.rate, "unit": r.unit,
            "efficiency": 1.0 if r is base else eff, "final_loss": r.last_loss,
            "val_loss": r.val_loss, "target": target, "time_to_target_s": t, "gpu_hours": hours,
            "cost": cost(hours, price), "bottleneck": bottleneck(r, None if r is base else eff, base is not None),
            **_breakdown_columns(r.time_breakdown),
            **r.metrics,
        })
    return out


def metric_columns(table: Sequence[Mapping[str, Any]]) -> list[str]:
    """The tasks' extra metrics (``train/accuracy``, ``val/accuracy``, …) any row has, validation first."""
    keys = {k for r in table for k in r if k.startswith(("train/", "val/"))}
    return sorted(keys, key=lambda k: (not k.startswith("val/"), k))


def _breakdown_columns(tb: Mapping[str, Any] | None) -> dict[str, float | None]:
    """The slowest rank's data and exposed-sync shares of a step, and the rank gap (None where not timed)."""
    shares = (tb or {}).get("shares") or {}
    return {"data_share": shares.get("data"), "exposed_sync_share": shares.get("exposed_sync"),
            "rank_gap_pct": (tb or {}).get("gap_pct")}


def warnings(runs: Sequence[Run]) -> list[str]:
    """What makes the runs not directly comparable, in words: within each group (:func:`groups`), differing global
    batches and settings (not the keys a sweep varied: they are the comparison); across groups, that nothing is
    compared across them."""
    out = []
    runs = [replace(r, label=x) for r, x in zip(runs, labels(runs), strict=True)]
    expected = (*EXPECTED_DIFFERENCES, *swept_values(runs))
    parts = groups(runs)
    if len(parts) > 1:
        out.append(f"the runs fall into {len(parts)} groups that do not compare ({'; '.join(parts)}): different "
                   "tasks or throughput units, so scaling efficiency, time to target and cost are computed within "
                   "each group only")
    for group, members in parts.items():
        where = f"{group}: " if len(parts) > 1 else ""
        batches = {r.global_batch for r in members if r.global_batch}
        if len(batches) > 1:
            out.append(f"{where}the global batches differ (" + ", ".join(f"{r.label}: {r.global_batch}"
                                                                       for r in members)
                       + "): the runs solve different optimisation problems, so their losses per step do not compare")
        diff = config_differences({r.label: r.config for r in members if r.config}, expected)
        if diff:
            out.append(f"{where}other settings differ: " + "; ".join(
                f"{k} ({', '.join(f'{n}: {v}' for n, v in vals.items())})" for k, vals in list(diff.items())[:12])
                + (f"; and {len(diff) - 12} more" if len(diff) > 12 else ""))
    return out


def _fmt(v: Any, kind: str = "") -> str:
    if v is None:
        return "—"
    if kind == "pct":
        return f"{100 * v:.1f}%"
    if isinstance(v, float):
        return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}"
    return str(v)


def _table_lines(table: Sequence[Mapping[str, Any]], gpu: bool) -> list[str]:
    target = next((r["target"] for r in table if r.get("target") is not None), None)
    extra = metric_columns(table)
    scaled = any(r["efficiency"] is not None for r in table)
    head = ["run", "status", "ranks", "global batch", "throughput", *(["scaling eff."] if scaled else []),
            "final loss", "val loss", *extra, f"time to loss {target:.4g}" if target is not None else "time to target"]
    head += ["GPU-hours", "cost"] if gpu else []
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in table:
        warn = " ⚠" if r["status"] != layout.STATUS_COMPLETED else ""
        cells = [r.get("label") or r["run"], r["status"] + warn, str(r["world"]), _fmt(r["global_batch"]),
                 f"{_fmt(r['rate'])} {r['unit']}" if r["rate"] else "—",
                 *([_fmt(r["efficiency"], "pct")] if scaled else []),
                 _fmt(r["final_loss"]), _fmt(r["val_loss"]), *(_fmt(r.get(k)) for k in extra),
                 f"{r['time_to_target_s']:.1f} s" if r["time_to_target_s"] is not None else "not reached"]
        if gpu:
            cells += [f"{r['gpu_hours']:.4f}" if r["gpu_hours"] is not None else "— (CPU)" if r["device"] != "cuda"
                      else "—", f"${r['cost']:.4f}" if r["cost"] is not None else "—"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def markdown(table: Sequence[Mapping[str, Any]], warns: Sequence[str], price: float,
             swept: Mapping[str, Sequence[str]] | None = None) -> str:
    """The report as Markdown: what the sweep varied, the warnings, one table per group (task and unit) with the
    legend of its columns under it, the bottleneck sentences. GPU-hours and cost appear only when some run ran on
    GPUs; scaling efficiency only in a group whose runs' world sizes differ."""
    gpu = any(r["device"] == "cuda" for r in table)
    by: dict[str, list[Mapping[str, Any]]] = {}
    for r in table:
        by.setdefault(r["group"], []).append(r)
    out = ["# Comparison", ""]
    if swept:
        out += ["Swept (what the runs differ in on purpose): " + "; ".join(
            f"{k} = {', '.join(map(str, vals))}" for k, vals in swept.items()) + ".", ""]
    if warns:
        out += ["**Warning:** " + w + "." for w in warns] + [""]
    for group, members in by.items():
        out += ([f"## {group}", ""] if len(by) > 1 else []) + _table_lines(members, gpu) + [""]
    out += [f"Cost at ${price:.2f} per GPU-hour (--price), for GPU runs only; CPU runs have none." if gpu else
            "CPU runs only: no GPU-hours or cost.", "", *legend.lines(table, gpu, price, several_groups=len(by) > 1),
            "", "## Where the time goes", ""]
    out += [f"- {r['bottleneck']}" for r in table]
    return "\n".join(out) + "\n"


def sweep_trials(paths: Sequence[str]) -> str:
    """For each sweep directory among ``paths`` whose sweep.json records objectives: its trials and the best."""
    from ddp_runner.report.sweep import SWEEP_JSON, trials_markdown

    out = []
    for p in paths:
        try:
            record = records.read_url(layout.join(p, SWEEP_JSON), records.fix_for(SWEEP_JSON, p))
        except records.DamagedFile:  # the table goes without its trials
            continue
        if record and record.get("objective"):
            out.append(f"\n{trials_markdown(record)}")
    return "".join(out)


def write_csv(table: Sequence[Mapping[str, Any]], path: Path) -> None:
    """The table as CSV (raw numbers, one row per run)."""
    buf = io.StringIO()
    names = [*COLUMNS, *metric_columns(table), "bottleneck"]
    w = csv.DictWriter(buf, fieldnames=names)
    w.writeheader()
    for r in table:
        w.writerow({k: r.get(k) for k in names})
    path.write_text(buf.getvalue())
