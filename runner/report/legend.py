"""The legend under ``ddp-compare``'s table: one line for every column the table shows, so that no column (a
"time to loss 1.78", a task's own metric) is left for the reader to guess. Pure: it reads the table's rows."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ddp_runner.report.compare_math import SMOOTHING_WINDOW


def lines(table: Sequence[Mapping[str, Any]], gpu: bool, price: float, several_groups: bool = False) -> list[str]:
    """``Columns:`` and one Markdown list item per column of the table(s), in the table's order. ``gpu``: the
    GPU-hours and cost columns are shown; ``several_groups``: each group has its own baseline and target."""
    of_group = " of its group" if several_groups else ""
    labelled = any(r.get("label") not in (None, r["run"]) for r in table)
    targets = sorted({r["target"] for r in table if r.get("target") is not None})
    metrics = sorted({k for r in table for k in r if k.startswith(("train/", "val/"))},
                     key=lambda k: (not k.startswith("val/"), k))
    items = [
        ("run", "a sweep's job by the values it swept (report.csv's `run` column names its directory), any other "
                "run by its directory's name" if labelled else "the run directory's name"),
        ("status", "how the run ended (⚠: it did not complete)"),
        ("ranks", "the world size: processes, one per GPU or CPU rank"),
        ("global batch", "samples per optimizer step: per-rank batch × ranks × accumulation"),
        ("throughput", "samples (tokens, for a task that has them) per second over all ranks, at the median step "
                       "time"),
    ]
    if any(r.get("efficiency") is not None for r in table):
        items.append(("scaling eff.", f"throughput per rank against the completed run with the fewest ranks{of_group}"
                                      " (of a sweep's jobs: the one with the same values of the other swept keys);"
                                      " 100%: twice the ranks, twice the throughput; only where world sizes differ"))
    items += [("final loss", "the last logged training loss"), ("val loss", "the last validation loss")]
    items += [(m, "the task's own metric: its last logged value (summary.json)") for m in metrics]
    if targets:
        name = f"time to loss {targets[0]:.4g}" if len(targets) == 1 else "time to loss X"
        items.append((name, f"training time until the smoothed training loss (the median of the last "
                            f"{SMOOTHING_WINDOW} logged losses, so that one lucky batch does not count) first reached "
                            f"{'it' if len(targets) == 1 else 'X'}, the loss every completed run{of_group} reached "
                            "so smoothed (--target-loss sets another): the first step (start-up, compilation) plus "
                            "the later steps at the median step time; not reached: never"))
    else:
        items.append(("time to target", "no completed run with a logged loss, so no target loss to time"))
    if gpu:
        items += [("GPU-hours", "time to the target loss × GPUs, for runs on GPUs"),
                  ("cost", f"those GPU-hours at ${price:.2f} per GPU-hour (--price)")]
    return ["Columns:", *(f"- **{name}**: {text}" for name, text in items)]
