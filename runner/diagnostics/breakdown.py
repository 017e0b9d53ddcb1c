"""A run's ``time_breakdown`` (summary.json) in words: the console's end-of-run lines and the phrases ddp-compare
puts in its bottleneck sentence. Pure functions over the recorded figures (the engine measures them:
tasks/engine/timing.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# Below these, a phase is not worth a phrase in the bottleneck sentence.
SHARE_WORTH_SAYING = 0.01
GAP_WORTH_SAYING = 1.0  # percent


def lines(tb: Mapping[str, Any] | None, prefix: str = "ddp-run: ") -> list[str]:
    """One line per rank (mean ms per optimizer step in each phase), then the slowest and fastest rank."""
    if not tb or not tb.get("per_rank"):
        return []
    out = []
    for r, v in sorted(tb["per_rank"].items(), key=lambda kv: int(kv[0])):
        out.append(f"{prefix}rank {r} per step (mean ms): data {v['data_ms']:.1f} · compute {v['compute_ms']:.1f}"
                   f" · exposed gradient sync {v['exposed_sync_ms']:.1f} · optimizer {v['optimizer_ms']:.1f}"
                   f" = {v['step_ms']:.1f}")
    shares = tb.get("shares") or {}
    tail = ", ".join(f"{name} {100 * shares[k]:.0f}%" for k, name in
                     (("data", "data"), ("compute", "compute"), ("exposed_sync", "exposed sync"),
                      ("optimizer", "optimizer")) if shares.get(k) is not None)
    if len(tb["per_rank"]) > 1 and tb.get("gap_pct") is not None:
        # The work in ms beside the percentage: on tiny steps a small difference is a large percentage.
        work = {r: v["step_ms"] - v["exposed_sync_ms"] for r, v in tb["per_rank"].items()}
        slow, fast = work.get(str(tb["slowest_rank"])), work.get(str(tb["fastest_rank"]))
        ms = f" ({slow:.2f} against {fast:.2f} ms)" if slow is not None and fast is not None else ""
        out.append(f"{prefix}slowest rank {tb['slowest_rank']}, fastest rank {tb['fastest_rank']}:"
                   f" {tb['gap_pct']:.1f}% more work per step{ms}; the slowest rank's step: {tail}")
    elif tail:
        out.append(f"{prefix}each step: {tail}")
    if tb.get("warmup_included"):
        out.append(f"{prefix}(one logging window only, warm-up included: run more steps than train.log_every for"
                   " the steady state)")
    return out


def phrases(tb: Mapping[str, Any] | None) -> list[str]:
    """What the bottleneck sentence says about the time breakdown: the share of each step that waits for data
    and for gradient sync (on the slowest rank: the waits nobody hid), and how much slower the slowest rank is."""
    if not tb or not tb.get("shares"):
        return []
    shares, out = tb["shares"], []
    if (d := shares.get("data")) is not None:
        out.append(f"{100 * d:.0f}% of each step waits for data" if d >= SHARE_WORTH_SAYING
                   else "data loading is hidden (under 1% of a step)")
    if len(tb.get("per_rank") or {}) > 1 and (s := shares.get("exposed_sync")) is not None:
        out.append(f"{100 * s:.0f}% of each step waits for gradient sync" if s >= SHARE_WORTH_SAYING
                   else "gradient sync is hidden behind the backward (under 1% of a step)")
    if (o := shares.get("optimizer")) is not None and o >= 0.1:
        out.append(f"the optimizer takes {100 * o:.0f}% of each step")
    gap = tb.get("gap_pct")
    if gap is not None and gap >= GAP_WORTH_SAYING:
        out.append(f"rank {tb['slowest_rank']} is {gap:.0f}% slower than rank {tb['fastest_rank']}")
    if out and tb.get("warmup_included"):
        out.append("(these from one logging window, warm-up included)")
    return out


STARTUP_NAMES = {"driver": "driver checks", "agent": "torchrun and interpreter", "imports": "imports",
                 "process_group": "process group", "build": "model and data", "loop_setup": "loop set-up"}
WALL_NAMES = {"startup": "start-up", "first_step": "first step", "checkpoint": "checkpoints",
              "validation": "validation", "training": "training"}


def goodput_lines(goodput: Mapping[str, Any] | None, prefix: str = "ddp-run: ") -> list[str]:
    """Where the launch's wall-clock went (start-up and its parts, first step, checkpoints, validation, training)
    and the throughput over all of it."""
    if not goodput or not goodput.get("seconds"):
        return []
    secs, wall = goodput["seconds"], goodput.get("wall_s") or 0.0
    shown = [f"{WALL_NAMES[k]} {secs[k]:.1f} s" for k in WALL_NAMES if secs.get(k)]
    rate = goodput.get("tokens_per_s")
    unit = "tokens/s"
    if rate is None:
        rate, unit = goodput.get("samples_per_s"), "samples/s"
    out = [f"{prefix}wall-clock {wall:.1f} s: " + ", ".join(shown)
           + (f"; goodput {rate:,.0f} {unit}" if rate is not None else "")]
    parts = goodput.get("startup_parts") or {}
    if parts:
        out.append(f"{prefix}start-up: " + ", ".join(f"{STARTUP_NAMES.get(k, k)} {v:.1f} s" for k, v in parts.items()))
    if goodput.get("time_to_first_checkpoint_s") is not None:
        out[-1] += f"; first checkpoint at {goodput['time_to_first_checkpoint_s']:.1f} s"
    return out
