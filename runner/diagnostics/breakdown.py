"""A run's ``time_breakdown`` (summary.json) in words: the console's end-of-run lines and the phrases ddp-compare
puts in its bottleneck sentence. Pure functions over the recorded figures (the engine measures them:
tasks/engine/timing.py)."""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from typing import Any

from ddp_runner.console import textfit

# Below this, a phase is not worth a phrase in the bottleneck sentence.
SHARE_WORTH_SAYING = 0.01
# The rank with the most work is an imbalance only this far over the ranks' median work per step, in per cent and
# in ms: below, the difference is run-to-run noise (a median: one slow rank cannot hide behind another).
IMBALANCE_PCT = 3.0
IMBALANCE_FLOOR_MS = 0.02  # timer and launch jitter


PHASE_COLUMNS = (("data_ms", "data"), ("compute_ms", "compute"), ("exposed_sync_ms", "exposed sync"),
                 ("optimizer_ms", "optimizer"), ("step_ms", "step"))


def work_ms(v: Mapping[str, float]) -> float:
    """A rank's own work per step: its step time less the time it waited in the gradient sync. Every DDP step
    lasts as long as the slowest rank's, so the fast ranks wait longest: the work, not the step, tells them apart."""
    return v["step_ms"] - v["exposed_sync_ms"]


def _gpu_cells(g: Mapping[str, float] | None) -> list[str]:
    if not g:
        return []
    return [f"{g['sm_clock_mhz']:.0f} MHz", f"{g['power_w']:.0f} W", f"{g['temperature_c']:.0f} °C"]


def _gpu_notes(g: Mapping[str, float] | None) -> list[str]:
    notes = []
    if g and g.get("power_capped_pct", 0) >= 50:
        notes.append("at its power limit")
    if g and g.get("thermal_slowdown_pct", 0) > 0:
        notes.append(f"thermal slowdown {g['thermal_slowdown_pct']:.0f}% of the time")
    return notes


# The columns a narrow terminal loses first (summary.json keeps them all): the rank, its device, its work and the
# mark of the rank with the most work always stay.
DROP_FIRST = ("temp", "power", "optimizer", "data", "GPU clock", "compute", "exposed sync", "step")


def table(tb: Mapping[str, Any] | None, devices: Mapping[str, str] | None = None,
          gpus: Mapping[str, Mapping[str, float]] | None = None, indent: str = "  ",
          width: int | None = None) -> list[str]:
    """ONE table of the ranks: device, mean ms per optimizer step in each phase, the step, the rank's own work
    (step less exposed sync) and, with telemetry, its GPU's clock, power and temperature; the rank with the most
    work is marked (the same rank :func:`slowest_line` names). Narrowed to ``width`` columns (:data:`DROP_FIRST`)."""
    ranks = sorted({*((tb or {}).get("per_rank") or {}), *(gpus or {})}, key=int)
    if not ranks:
        return []
    per_rank, devices, gpus = (tb or {}).get("per_rank") or {}, devices or {}, gpus or {}
    head = ["rank", "device"]
    if per_rank:
        head += [name for _, name in PHASE_COLUMNS] + ["work"]
    if gpus:
        head += ["GPU clock", "power", "temp"]
    rows = [head]
    for r in ranks:
        row = [r, devices.get(r, "?")]
        v = per_rank.get(r)
        if per_rank:
            row += [f"{v[k]:.1f} ms" for k, _ in PHASE_COLUMNS] + [f"{work_ms(v):.1f} ms"] if v else ["-"] * 6
        if gpus:
            row += _gpu_cells(gpus.get(r)) or ["-"] * 3
        notes = _gpu_notes(gpus.get(r))
        if len(per_rank) > 1 and r == str(tb.get("slowest_rank")):
            notes.insert(0, "most work")
        rows.append(row + ([", ".join(notes)] if notes else []))
    return textfit.columns(rows, width, DROP_FIRST, indent)


def imbalanced(tb: Mapping[str, Any] | None) -> bool:
    """Whether the rank with the most work is worth naming: its work per step over the ranks' median by
    :data:`IMBALANCE_PCT` per cent and by :data:`IMBALANCE_FLOOR_MS` (a +0.1% rank sends nobody anywhere)."""
    per_rank = (tb or {}).get("per_rank") or {}
    slow = per_rank.get(str((tb or {}).get("slowest_rank")))
    if len(per_rank) < 2 or slow is None:
        return False
    median = statistics.median(work_ms(v) for v in per_rank.values())
    over = work_ms(slow) - median
    return over >= IMBALANCE_FLOOR_MS and over >= median * IMBALANCE_PCT / 100


def slowest_line(tb: Mapping[str, Any] | None) -> str | None:
    """The sentence under the table: the rank with the most work, by how much, and where its step goes."""
    if not tb or not tb.get("per_rank"):
        return None
    shares = tb.get("shares") or {}
    tail = ", ".join(f"{name} {100 * shares[k]:.0f}%" for k, name in
                     (("data", "data"), ("compute", "compute"), ("exposed_sync", "exposed sync"),
                      ("optimizer", "optimizer")) if shares.get(k) is not None)
    per_rank = tb["per_rank"]
    slow, fast = str(tb.get("slowest_rank")), str(tb.get("fastest_rank"))
    if len(per_rank) > 1 and slow in per_rank and fast in per_rank and tb.get("gap_pct") is not None:
        figures = (f"{work_ms(per_rank[slow]):.2f} ms against {work_ms(per_rank[fast]):.2f} ms on rank {fast},"
                   f" {tb['gap_pct']:+.1f}%")
        if imbalanced(tb):
            out = (f"rank {slow} has the most work per step ({figures}); the other ranks wait for it in the gradient"
                   " sync" + (f". Rank {slow}'s step: {tail}" if tail else ""))
        else:
            out = (f"the ranks' work per step is even (rank {slow} the most: {figures}, under {IMBALANCE_PCT:.0f}%"
                   " over the median)" + (f". Each step: {tail}" if tail else ""))
    elif tail:
        out = f"each step: {tail}"
    else:
        return None
    if tb.get("warmup_included"):
        out += (" (one logging window only, warm-up included: run more steps than train.log_every for the steady"
                " state)")
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
    if tb.get("gap_pct") is not None and imbalanced(tb):
        out.append(f"rank {tb['slowest_rank']} is {tb['gap_pct']:.0f}% slower than rank {tb['fastest_rank']}")
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
