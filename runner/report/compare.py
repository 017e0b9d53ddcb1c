"""``ddp-compare``: a set of run directories (or sweep directories) → a table, a CSV, plots and one sentence per
run that answers "is N GPUs worth it for this job, what does it cost, and if not, why".

Only what holds is said: runs are compared within groups of one task and one throughput unit (never an efficiency
across samples/s and tokens/s, or across tasks); scaling efficiency only between runs that differ in world size;
a sweep's keys are what it compares, not a difference to warn of, and its jobs are called by their values
(``lr=0.001``); GPU-hours and cost only for runs on GPUs; every column is named in the legend under the table
(runner/report/legend.py); every sentence on where the time goes names its run.

Reads only what the runs wrote (run.json, summary.json, config.yaml). The arithmetic is in pure functions
(efficiency, time to a target loss, cost, the bottleneck sentence, the config difference), tested on their own.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ddp_runner.contract import layout, series
from ddp_runner.contract.rules import flatten
from ddp_runner.diagnostics import breakdown
from ddp_runner.report import legend, projection_report
from ddp_runner.rundir import records
from ddp_runner.rundir.status import status_of

DEFAULT_PRICE = 2.50  # USD per GPU-hour: a round on-demand figure for a data-centre GPU; --price sets yours
# Keys that a fixed-global-batch study changes on purpose, or that only say where a run wrote.
EXPECTED_DIFFERENCES = ("world_size", "batch.accumulation", "output.root", "resume", "dry_run")


# -- pure arithmetic -----------------------------------------------------------------------------------------

def scaling_efficiency(rate: float | None, world: int, base_rate: float | None, base_world: int) -> float | None:
    """Throughput per rank over the baseline's throughput per rank (1.0 = perfect scaling)."""
    if not rate or not base_rate:
        return None
    return (rate / world) / (base_rate / base_world)


def loss_at_steps(losses: Sequence[float], log_every: int, total_steps: int,
                  steps: Sequence[int] | None = None) -> list[tuple[int, float]]:
    """(optimizer step, loss) pairs of a run's logged losses: at ``steps`` where summary.json names them (a long
    run's series is downsampled: runner/contract/series.py), else one every ``log_every`` steps, the last one at
    ``total_steps`` (the engine always logs the final step)."""
    if steps is None or len(steps) != len(losses):
        steps = series.log_steps(len(losses), log_every, total_steps)
    return list(zip(steps, losses, strict=True))


def time_to_target(points: Sequence[tuple[int, float]], target: float, step_time_s: float | None,
                   first_step_s: float | None = None) -> float | None:
    """Seconds of training until the logged loss first reaches ``target`` (None if it never does).

    Training time = the first step (start-up and compilation, when known) + the later steps at the median step
    time. Checkpoints and validation are not in it: they are the same for every run of a comparison.
    """
    if step_time_s is None:
        return None
    for step, loss in points:
        if loss <= target:
            return (first_step_s or 0.0) + max(0, step - 1) * step_time_s
    return None


def gpu_hours(seconds: float | None, world: int) -> float | None:
    """GPU-hours of ``seconds`` on ``world`` devices."""
    return None if seconds is None else seconds * world / 3600.0


def cost(hours: float | None, price_per_gpu_hour: float) -> float | None:
    """Money for ``hours`` GPU-hours at ``price_per_gpu_hour``."""
    return None if hours is None else hours * price_per_gpu_hour


def common_target(runs: Sequence[Run]) -> float | None:
    """The loss every completed run reached: the highest of their best logged losses."""
    bests = [min(r.losses) for r in runs if r.losses and r.status == layout.STATUS_COMPLETED]
    return max(bests) if bests else None


def config_differences(configs: Mapping[str, Mapping[str, Any]],
                       expected: Sequence[str] = EXPECTED_DIFFERENCES) -> dict[str, dict[str, Any]]:
    """``{key: {run: value}}`` for every config key whose value is not the same in all runs (a key missing from
    a run counts as a difference), leaving out the keys a scaling study changes on purpose (and the keys, or the
    groups, under ``expected``)."""
    flat = {name: flatten(dict(cfg)) for name, cfg in configs.items()}
    keys = sorted(set().union(*(f.keys() for f in flat.values()))) if flat else []
    out: dict[str, dict[str, Any]] = {}
    for key in keys:
        if any(key == e or key.startswith(e + ".") for e in expected):
            continue
        values = {name: f.get(key, "<absent>") for name, f in flat.items()}
        if len({json.dumps(v, sort_keys=True, default=str) for v in values.values()}) > 1:
            out[key] = values
    return out


def bottleneck(run: Run, efficiency: float | None, scaled: bool = True) -> str:
    """One sentence on where the run's time goes, from its measured figures; it starts with the run's label.
    ``scaled``: the comparison measures scaling (its runs' world sizes differ), so the sentence says the run's
    efficiency, or that it is the baseline."""
    who = f"{run.label or run.name} ({run.world} {'GPU' if run.device == 'cuda' else 'rank'}" \
          f"{'s' if run.world != 1 else ''})"
    if run.status != layout.STATUS_COMPLETED:
        why = run.failure or "no summary"
        return f"{who}: {run.status}: {why}."
    lead = (f"{100 * efficiency:.0f}% scaling efficiency" if efficiency is not None
            else "the baseline of the scaling efficiency" if scaled else None)
    parts = [lead] if lead else []
    measured = breakdown.phrases(run.time_breakdown)  # each rank's phases, where the run timed them
    parts += measured
    if not measured and run.step_time_s and run.data_wait_s is not None:
        share = run.data_wait_s / run.step_time_s
        parts.append(f"{100 * share:.0f}% of each step waits for data" if share >= 0.01
                     else "data loading is hidden (under 1% of a step)")
    shares = (run.goodput or {}).get("shares") or {}
    heavy = [(k, v) for k, v in shares.items() if k in ("checkpoint", "validation") and v and v >= 0.05]
    parts += [f"{k}s take {100 * v:.0f}% of the wall-clock" for k, v in heavy]
    if shares.get("startup") and shares["startup"] >= 0.25:
        parts.append(f"start-up is {100 * shares['startup']:.0f}% of the wall-clock (a longer run amortises it)")
    clocks = {r: g.get("sm_clock_mhz") for r, g in (run.gpus or {}).items() if g.get("sm_clock_mhz")}
    if len(clocks) > 1:
        slow, fast = min(clocks, key=clocks.get), max(clocks, key=clocks.get)
        gap = 1 - clocks[slow] / clocks[fast]
        if gap >= 0.02:
            parts.append(f"rank {slow}'s GPU clocks {100 * gap:.0f}% below rank {fast}'s, and every step waits for it")
    if (not measured and efficiency is not None and efficiency < 0.95 and len(parts) == 2
            and "hidden" in parts[1]):
        parts.append("the rest is gradient synchronisation and per-rank overhead (profile with train.profile.steps)")
    return f"{who}: " + ("; ".join(parts) or "no time breakdown recorded") + "."


# -- reading runs ---------------------------------------------------------------------------------------------

@dataclass
class Run:
    """What a comparison needs from one run directory."""

    path: Path
    name: str
    status: str
    world: int
    device: str
    global_batch: int | None
    task: str | None
    config: dict[str, Any] = field(default_factory=dict)
    losses: list[float] = field(default_factory=list)
    loss_steps: list[int] | None = None  # the step of each loss (summary.json's loss_steps; older runs: none)
    log_every: int = 1
    steps: int = 0
    step_time_s: float | None = None
    data_wait_s: float | None = None
    tokens_per_sample: int | None = None
    first_step_s: float | None = None
    val_loss: float | None = None
    goodput: dict[str, Any] | None = None
    gpus: dict[str, dict[str, float]] | None = None
    time_breakdown: dict[str, Any] | None = None
    failure: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)  # the task's own: train/<name>, val/<name>
    swept: dict[str, str] = field(default_factory=dict)  # a sweep's job: its value of each swept key
    label: str | None = None  # what the report calls it (:func:`labels`); None: its directory's name

    @property
    def samples_per_s(self) -> float | None:
        """Global samples per second at the median step time."""
        return self.global_batch / self.step_time_s if self.global_batch and self.step_time_s else None

    @property
    def rate(self) -> float | None:
        """Tokens/s for a task with tokens, else samples/s."""
        sps = self.samples_per_s
        return sps * self.tokens_per_sample if sps and self.tokens_per_sample else sps

    @property
    def unit(self) -> str:
        """The unit of :attr:`rate`."""
        return "tokens/s" if self.tokens_per_sample else "samples/s"


def find_runs(paths: Sequence[str]) -> list[Path]:
    """Run directories among ``paths``: each one itself, or every run directory under a sweep directory."""
    found: list[Path] = []
    for p in map(Path, paths):
        if (p / layout.MANIFEST).is_file():
            found.append(p)
        elif p.is_dir():
            found += sorted(c.parent for c in p.rglob(layout.MANIFEST))
        else:
            raise FileNotFoundError(f"{p}: not a run directory or a folder holding some")
    return list(dict.fromkeys(found))


def load_run(path: Path) -> Run:
    """Read one run directory (a run that has no summary yet, or failed, is still a row)."""
    from fsspec.implementations.local import LocalFileSystem

    fs, run = LocalFileSystem(), str(path)
    manifest = records.read_manifest(fs, run)  # DamagedFile: the caller refuses with its one line
    summary = records.read_summary(fs, run) or {}
    config = records.read_config(fs, run, complete=False) if (path / layout.CONFIG).is_file() else {}
    try:
        return _run_of(path, manifest, summary, config)
    except (TypeError, ValueError, AttributeError, KeyError) as exc:  # a value of the wrong kind in a valid file
        raise records.DamagedFile(str(path / layout.SUMMARY), f"holds a value of the wrong kind ({type(exc).__name__}:"
                                  f" {str(exc)[:120]})", records.fix_for(layout.SUMMARY, run)) from None


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _number(value: Any) -> float | None:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _run_of(path: Path, manifest: dict[str, Any], summary: dict[str, Any], config: dict[str, Any]) -> Run:
    plan = manifest["plan"]
    median = _mapping(summary.get("median"))
    final = _mapping(summary.get("final"))
    step_s = _number(median.get("step_time_s")) or _number(final.get("perf/step_time_s"))
    gb = _number(plan.get("global_batch"))
    # Tokens per sample, as the run itself counted them (tokens/s over samples/s), for any task that has tokens.
    tokens = (round(median["tokens_per_s"] * median["step_time_s"] / gb)
              if median.get("tokens_per_s") and median.get("step_time_s") and gb else None)
    cause = _mapping(summary.get("root_cause"))
    who = f"rank {cause.get('rank')}" if cause.get("rank") is not None else cause.get("where") or "the launcher"
    failure = f"{who}: {cause.get('type')}: {str(cause.get('message'))[:120]}" if cause else None
    # run.json is the record of a run's status (a continued run's summary.json is the earlier attempt's)
    status = summary["status"] if summary.get("status") and not manifest.get("status") else status_of(manifest)
    return Run(
        path=path, name=path.name, status=status,
        world=int(plan.get("world_size") or 0), device=str(plan.get("device", "cpu")),
        global_batch=gb, task=manifest.get("task"), config=config,
        **_losses(summary),
        log_every=int((config.get("train") or {}).get("log_every") or 1), steps=int(summary.get("steps") or 0),
        step_time_s=step_s, data_wait_s=_number(final.get("perf/data_wait_s")), tokens_per_sample=tokens,
        first_step_s=_first_step_seconds(summary), val_loss=_number(summary.get("val_loss")),
        goodput=_mapping(summary.get("goodput")) or None, gpus=_mapping(summary.get("gpus")) or None,
        time_breakdown=_mapping(summary.get("time_breakdown")) or None,
        failure=failure,
        metrics={k: v for k, v in _mapping(summary.get("metrics")).items() if isinstance(v, (int, float))},
        swept={str(k): str(v) for k, v in _mapping(_mapping(manifest.get("invocation")).get("swept")).items()},
    )


def _losses(summary: Mapping[str, Any]) -> dict[str, Any]:
    """A run's finite logged losses and, where summary.json names them, their steps (both with the same points
    left out)."""
    values = summary.get("losses") or []
    steps = summary.get("loss_steps")
    ok = [i for i, v in enumerate(values) if v is not None and math.isfinite(v)]
    named = isinstance(steps, list) and len(steps) == len(values)
    return {"losses": [values[i] for i in ok], "loss_steps": [steps[i] for i in ok] if named else None}


def _first_step_seconds(summary: Mapping[str, Any]) -> float | None:
    g = summary.get("goodput") or {}
    seconds = g.get("seconds") or {}
    if "first_step" in seconds:
        return float(seconds["first_step"]) + float(seconds.get("startup", 0.0))
    return summary.get("time_to_first_step_s")


# -- the report -----------------------------------------------------------------------------------------------

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
            "efficiency": 1.0 if r is base else eff, "final_loss": r.losses[-1] if r.losses else None,
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
    for p in map(Path, paths):
        try:
            record = json.loads((p / SWEEP_JSON).read_text())
        except (OSError, ValueError):
            continue
        if record.get("objective"):
            out.append(f"\n{trials_markdown(record)}")
    return "".join(out)


def plots(runs: Sequence[Run], table: Sequence[Mapping[str, Any]], out: Path) -> list[Path]:
    """throughput.png (against world size, with the ideal line; one panel per group), loss_vs_step.png and
    loss_vs_time.png (one panel per group: losses of different tasks share no axis)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    parts = groups(runs)
    names = list(parts)
    written = []
    fig, axes = plt.subplots(len(names), 1, figsize=(6, 4 * len(names)), squeeze=False)
    for ax, group in zip(axes[:, 0], names, strict=True):
        done = [r for r in table if r["group"] == group and r["status"] == layout.STATUS_COMPLETED and r["rate"]]
        if done:
            base = min(done, key=lambda r: r["world"])
            worlds = sorted({r["world"] for r in done})
            ax.plot(worlds, [base["rate"] / base["world"] * w for w in worlds], "--", color="grey", label="ideal")
            ax.plot([r["world"] for r in done], [r["rate"] for r in done], "o-", label="measured")
            ax.set_xticks(worlds)
            ax.set_ylabel(done[0]["unit"])
        ax.set_xlabel("ranks (world size)")
        ax.set_title(f"Throughput against world size: {group}" if len(names) > 1 else "Throughput against world size")
        if ax.get_lines():
            ax.legend()
    fig.tight_layout()
    written.append(out / "throughput.png")
    fig.savefig(written[-1], dpi=100)
    plt.close(fig)
    for name, xlabel in (("loss_vs_step.png", "optimizer step"), ("loss_vs_time.png", "training time (s)")):
        fig, axes = plt.subplots(len(names), 1, figsize=(6, 4 * len(names)), squeeze=False)
        for ax, group in zip(axes[:, 0], names, strict=True):
            _loss_panel(ax, parts[group], timed=name == "loss_vs_time.png")
            ax.set_xlabel(xlabel)
            ax.set_ylabel("train loss")
            if len(names) > 1:
                ax.set_title(group)
        fig.tight_layout()
        written.append(out / name)
        fig.savefig(written[-1], dpi=100)
        plt.close(fig)
    return written


def _loss_panel(ax: Any, runs: Sequence[Run], timed: bool) -> None:
    for r in runs:
        pts = loss_at_steps(r.losses, r.log_every, r.steps, r.loss_steps)
        if not pts or (timed and not r.step_time_s):
            continue
        xs = [(r.first_step_s or 0.0) + (s - 1) * r.step_time_s for s, _ in pts] if timed else [s for s, _ in pts]
        ax.plot(xs, [v for _, v in pts], label=f"{r.name} ({r.status})")
    if ax.get_lines():
        ax.legend(fontsize="small")


def write_csv(table: Sequence[Mapping[str, Any]], path: Path) -> None:
    """The table as CSV (raw numbers, one row per run)."""
    buf = io.StringIO()
    names = [*COLUMNS, *metric_columns(table), "bottleneck"]
    w = csv.DictWriter(buf, fieldnames=names)
    w.writeheader()
    for r in table:
        w.writerow({k: r.get(k) for k in names})
    path.write_text(buf.getvalue())


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point of ``ddp-compare``."""
    ap = argparse.ArgumentParser(
        prog="ddp-compare", description="Compare run directories (or sweep directories): table, CSV, plots.",
        epilog="Example: ddp-compare outputs/2026-11-30/12-00-00_sweep --target-loss 3.5 --out report")
    ap.add_argument("paths", nargs="+", help="run directories, or folders (sweeps) holding run directories")
    ap.add_argument("--out", default="compare", help="folder for report.md, report.csv and the plots")
    ap.add_argument("--target-loss", type=float, default=None,
                    help="loss to time the runs to (default: in each group of runs of one task, the loss every "
                    "completed run of it reached)")
    ap.add_argument("--price", type=float, default=DEFAULT_PRICE,
                    help=f"price per GPU-hour for the cost column of GPU runs (default {DEFAULT_PRICE:.2f})")
    projection_report.add_arguments(ap)
    args = ap.parse_args(argv)
    if wrong := projection_report.problem(args):
        print(f"ddp-compare: error: {wrong}", file=sys.stderr)
        return 2
    try:
        paths = find_runs(args.paths)
    except FileNotFoundError as exc:
        print(f"ddp-compare: error: {exc}. Fix: pass run directories (holding {layout.MANIFEST}) or sweep"
              " folders", file=sys.stderr)
        return 2
    if not paths:
        print(f"ddp-compare: error: no run directory under {' '.join(args.paths)}", file=sys.stderr)
        return 2
    if args.price < 0:
        print(f"ddp-compare: error: --price={args.price}: must be >= 0", file=sys.stderr)
        return 2
    try:
        runs = [load_run(p) for p in paths]
    except records.DamagedFile as damaged:
        print(damaged.line("ddp-compare"), file=sys.stderr)
        return 2
    if wrong := projection_report.runs_problem(groups(runs), args):
        print(f"ddp-compare: error: {wrong}", file=sys.stderr)
        return 2
    # The loss to time the runs to: the user's, or in each group the loss every completed run of it reached.
    target = args.target_loss if args.target_loss is not None else {
        group: common_target(members) for group, members in groups(runs).items()}
    table = rows(runs, target, args.price)
    warns = warnings(runs)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    projected, projected_files = projection_report.section(groups(runs), args, out)  # with --project
    report = markdown(table, warns, args.price, swept_values(runs)) + sweep_trials(args.paths) + projected
    (out / "report.md").write_text(report)
    write_csv(table, out / "report.csv")
    files = plots(runs, table, out) + projected_files
    print(report)
    print(f"ddp-compare: wrote {out / 'report.md'}, {out / 'report.csv'}, " + ", ".join(str(f) for f in files))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
