"""``ddp-compare``'s plots: throughput against world size (with the ideal line; only where world sizes differ), loss
against optimizer step and against training time; one panel per group of runs that compare
(runner/report/compare_table.py); legends name each run by what it differs in (its swept values)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ddp_runner.contract import layout
from ddp_runner.report.compare_math import loss_at_steps
from ddp_runner.report.compare_runs import Run
from ddp_runner.report.compare_table import groups


def plots(runs: Sequence[Run], table: Sequence[Mapping[str, Any]], out: Path) -> list[Path]:
    """throughput.png (against world size, with the ideal line; one panel per group whose completed runs' world
    sizes differ, and none at all where no group's do: at one world size there is no scaling to draw),
    loss_vs_step.png and loss_vs_time.png (one panel per group: losses of different tasks share no axis; each run
    named by what it differs in, :func:`legend_labels`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    parts = groups(runs)
    names = list(parts)
    written = []
    scaled = [g for g in names if len({r["world"] for r in _done(table, g)}) > 1]
    if scaled:
        written.append(_throughput(plt, table, scaled, len(names) > 1, out / "throughput.png"))
    label = dict(zip(map(id, runs), legend_labels(runs), strict=True))
    for name, xlabel in (("loss_vs_step.png", "optimizer step"), ("loss_vs_time.png", "training time (s)")):
        fig, axes = plt.subplots(len(names), 1, figsize=(6, 4 * len(names)), squeeze=False)
        for ax, group in zip(axes[:, 0], names, strict=True):
            _loss_panel(ax, parts[group], label, timed=name == "loss_vs_time.png")
            ax.set_xlabel(xlabel)
            ax.set_ylabel("train loss")
            if len(names) > 1:
                ax.set_title(group)
        fig.tight_layout()
        written.append(out / name)
        fig.savefig(written[-1], dpi=100)
        plt.close(fig)
    return written


def legend_labels(runs: Sequence[Run]) -> list[str]:
    """What a plot's legend calls each run: what it differs in, a sweep's job by every value it swept
    (``lr=0.01``; ``world_size=2 lr=0.01``: a plot has no ranks column), any other run, or a label two runs would
    share, by its directory's name."""
    out = [" ".join(f"{k.split('.')[-1]}={v}" for k, v in r.swept.items()) or r.name for r in runs]
    return [x if out.count(x) == 1 else r.name for x, r in zip(out, runs, strict=True)]


def _done(table: Sequence[Mapping[str, Any]], group: str) -> list[Mapping[str, Any]]:
    return [r for r in table if r["group"] == group and r["status"] == layout.STATUS_COMPLETED and r["rate"]]


def _throughput(plt: Any, table: Sequence[Mapping[str, Any]], scaled: Sequence[str], titled: bool,
                path: Path) -> Path:
    """throughput.png: one panel per group in ``scaled``, measured against ideal (the fewest ranks' per-rank rate)."""
    fig, axes = plt.subplots(len(scaled), 1, figsize=(6, 4 * len(scaled)), squeeze=False)
    for ax, group in zip(axes[:, 0], scaled, strict=True):
        done = _done(table, group)
        base = min(done, key=lambda r: r["world"])
        worlds = sorted({r["world"] for r in done})
        ax.plot(worlds, [base["rate"] / base["world"] * w for w in worlds], "--", color="grey", label="ideal")
        ax.plot([r["world"] for r in done], [r["rate"] for r in done], "o-", label="measured")
        ax.set_xticks(worlds)
        ax.set_ylabel(done[0]["unit"])
        ax.set_xlabel("ranks (world size)")
        ax.set_title(f"Throughput against world size: {group}" if titled else "Throughput against world size")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _loss_panel(ax: Any, runs: Sequence[Run], label: Mapping[int, str], timed: bool) -> None:
    for r in runs:
        pts = loss_at_steps(r.losses, r.log_every, r.steps, r.loss_steps)
        if not pts or (timed and not r.step_time_s):
            continue
        xs = [(r.first_step_s or 0.0) + (s - 1) * r.step_time_s for s, _ in pts] if timed else [s for s, _ in pts]
        ax.plot(xs, [v for _, v in pts], label=f"{label[id(r)]} ({r.status})")
    if ax.get_lines():
        ax.legend(fontsize="small")
