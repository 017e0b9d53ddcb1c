"""``ddp-compare``'s plots: throughput against world size (with the ideal line), loss against optimizer step and
against training time; one panel per group of runs that compare (runner/report/compare_table.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ddp_runner.contract import layout
from ddp_runner.report.compare_math import loss_at_steps
from ddp_runner.report.compare_runs import Run
from ddp_runner.report.compare_table import groups


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
