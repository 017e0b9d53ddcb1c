"""``ddp-compare``'s arithmetic, pure functions tested on their own: scaling efficiency, time to a target loss,
GPU-hours and cost, the loss every run reached, the config difference, and the sentence on where a run's time goes.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from ddp_runner.contract import layout, series
from ddp_runner.contract.rules import flatten
from ddp_runner.diagnostics import breakdown
from ddp_runner.report.compare_runs import Run

# Keys that a fixed-global-batch study changes on purpose, or that only say where a run wrote.
EXPECTED_DIFFERENCES = ("world_size", "batch.accumulation", "output.root", "resume", "dry_run")


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


# Logged losses in the window that time to a loss reads: one lucky (or unlucky) batch never moves its median.
SMOOTHING_WINDOW = 5


def smoothed(points: Sequence[tuple[int, float]], window: int = SMOOTHING_WINDOW) -> list[tuple[int, float]]:
    """(optimizer step, the median of the ``window`` logged losses up to that step), from the ``window``-th logged
    loss on; a series shorter than the window gives one point, the median of all of it at its last step.

    A run is credited with a loss only once it holds it: one lucky batch that dips below the target (a median of 5
    ignores up to 2) never counts, where the raw per-step loss would credit a run that never got there."""
    w = min(window, len(points))
    if w == 0:
        return []
    return [(points[i][0], statistics.median(v for _, v in points[i - w + 1:i + 1])) for i in range(w - 1, len(points))]


def time_to_target(points: Sequence[tuple[int, float]], target: float, step_time_s: float | None,
                   first_step_s: float | None = None) -> float | None:
    """Seconds of training until the smoothed logged loss (:func:`smoothed`: the median of the last
    :data:`SMOOTHING_WINDOW` logged losses) first reaches ``target`` (None if it never does).

    Training time = the first step (start-up and compilation, when known) + the later steps at the median step
    time. Checkpoints and validation are not in it: they are the same for every run of a comparison.
    """
    if step_time_s is None:
        return None
    for step, loss in smoothed(points):
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
    """The loss every completed run reached: the highest of their best smoothed losses (:func:`smoothed`), so that
    every completed run reaches it as :func:`time_to_target` reads it."""
    bests = [min(v for _, v in smoothed(loss_at_steps(r.losses, r.log_every, r.steps, r.loss_steps)))
             for r in runs if r.losses and r.status == layout.STATUS_COMPLETED]
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
