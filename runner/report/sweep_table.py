"""The table a sweep prints at its end, one row per job, fitted to the terminal (each finished job said one line
as it ended: runner/console/closing.py's ``job_line``). Pure: from the jobs as sweep.json records them."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from ddp_runner.console import textfit
from ddp_runner.report.sweep_search import state_text

# The columns a narrow terminal loses first (sweep.md and sweep.json keep them all): the job, its swept values,
# its status and the objective stay.
DROP_FIRST = ("throughput", "steps", "final loss", "val loss")
SHOWN = {"val_loss", "final_loss"}  # objectives that already have a column


def _number(value: Any, fmt: str = ".4f") -> str:
    return format(value, fmt) if isinstance(value, (int, float)) and math.isfinite(value) else "-"


def _rate(figures: Mapping[str, Any]) -> str:
    if figures.get("tokens_per_s"):
        return f"{figures['tokens_per_s']:,.0f} tokens/s"
    if figures.get("samples_per_s"):
        return f"{figures['samples_per_s']:,.0f} samples/s"
    return "-"


def rows(jobs: Sequence[Mapping[str, Any]], swept: Sequence[str], objective: Mapping[str, Any]) -> list[list[str]]:
    """The header and one row per job: number, swept values, status (``pruned at step 40``, as sweep.md says it),
    steps, losses, throughput (and the objective where it is another figure)."""
    key = str(objective.get("key") or "")
    extra = [key] if key and key not in SHOWN else []
    out = [["job", *swept, "status", "steps", "final loss", "val loss", "throughput", *extra]]
    for j in sorted(jobs, key=lambda j: j["job"]):
        f = j.get("figures") or {}
        out.append([str(j["job"]), *(str((j.get("values") or {}).get(k, "")) for k in swept), state_text(j),
                    str(f.get("steps") if f.get("steps") is not None else "-"), _number(f.get("final_loss")),
                    _number(f.get("val_loss")), _rate(f), *([_number(j.get("objective"), ".6g")] if extra else [])])
    return out


def table(jobs: Sequence[Mapping[str, Any]], swept: Sequence[str], objective: Mapping[str, Any],
          width: int | None = None) -> list[str]:
    """The sweep's jobs as an aligned table of at most ``width`` columns (None: every column)."""
    if not jobs:
        return []
    return textfit.columns(rows(jobs, swept, objective), width, DROP_FIRST)
