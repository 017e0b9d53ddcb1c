"""A finished run's headline figures from its summary.json, by one set of rules for every reader: ``ddp-runs``'
columns (runner/rundir/listing.py), ``ddp-compare``'s table (runner/report/compare_runs.py) and, through it, the
scaling projection and the sweep's trials.

Throughput is global samples per second at the median step time; for a task with tokens, times the tokens per
sample the run itself counted (its tokens/s over its samples/s), so that tokens/s and samples/s of one run are one
measurement. Losses are the finite ones summary.json logged; the last loss is the last of them, else the final
``train/loss``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

TOKENS, SAMPLES = "tokens/s", "samples/s"


def mapping(value: Any) -> dict[str, Any]:
    """``value`` when it is a mapping, else {} (a record's optional section that is absent or null)."""
    return dict(value) if isinstance(value, Mapping) else {}


def number(value: Any) -> float | int | None:
    """``value`` when it is a number (not a bool), else None."""
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class Figures:
    """A run's figures (None: not recorded). ``losses``: the finite logged losses, ``loss_steps``: the step of
    each, where summary.json names them (older runs: None)."""

    steps: int | None = None
    losses: list[float] = field(default_factory=list)
    loss_steps: list[int] | None = None
    last_loss: float | None = None
    step_time_s: float | None = None
    global_batch: float | int | None = None
    tokens_per_sample: int | None = None

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
        return TOKENS if self.tokens_per_sample else SAMPLES


def losses(summary: Mapping[str, Any]) -> tuple[list[float], list[int] | None]:
    """A run's finite logged losses and, where summary.json names them, their steps (both with the same points
    left out). TypeError for a loss that is not a number (a hand-edited file: the caller names the damage)."""
    values = summary.get("losses") or []
    steps = summary.get("loss_steps")
    ok = [i for i, v in enumerate(values) if v is not None and math.isfinite(v)]
    named = isinstance(steps, list) and len(steps) == len(values)
    return [values[i] for i in ok], [steps[i] for i in ok] if named else None


def of_summary(summary: Mapping[str, Any], global_batch: Any = None) -> Figures:
    """The figures of a run's summary.json; ``global_batch``: its plan's (run.json), else summary.json's."""
    median, final = mapping(summary.get("median")), mapping(summary.get("final"))
    median_s = number(median.get("step_time_s"))
    step_s = median_s or number(final.get("perf/step_time_s"))
    gb = number(global_batch if global_batch is not None else summary.get("global_batch"))
    tps = number(median.get("tokens_per_s"))
    # Tokens per sample, as the run itself counted them (tokens/s over samples/s), for any task that has tokens.
    tokens = round(tps * median_s / gb) if tps and median_s and gb else None
    kept, steps = losses(summary)
    final_loss = number(final.get("train/loss"))
    last = float(kept[-1]) if kept else None if final_loss is None else float(final_loss)
    return Figures(steps=summary["steps"] if isinstance(summary.get("steps"), int) else None, losses=kept,
                   loss_steps=steps, last_loss=last, step_time_s=step_s,
                   global_batch=gb, tokens_per_sample=tokens)
