"""What the console says when a run completes, from its summary: one line for a short run (the detail stays in
summary.json), else the outcome, one table of the ranks, the sentence about the rank with the most work, a note on
a slow GPU and where the wall-clock went. Pure functions over the recorded figures."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ddp_runner.console import textfit
from ddp_runner.diagnostics import breakdown

# A run this short gets one closing line: its timing figures are mostly start-up and warm-up. By steps only, so
# that the same config always closes the same way (a wall-clock bound would depend on the machine's load).
SHORT_STEPS = 20

# A clock gap between ranks' GPUs worth a note: every DDP step waits for the slowest GPU.
CLOCK_GAP = 0.03


def plural(n: int, word: str) -> str:
    """``1 rank``, ``2 ranks``."""
    return f"{n} {word}{'' if n == 1 else 's'}"


def where(check: Mapping[str, Any]) -> str:
    """``1 rank on cpu:0``, ``2 ranks on distinct devices (cuda:0, cuda:1)``, ``2 ranks on SHARED devices (…)``."""
    n, devices = len(check.get("completed_ranks") or []), list((check.get("devices") or {}).values())
    if n == 1:
        return f"1 rank on {devices[0]}" if devices else "1 rank"
    kind = "distinct" if check.get("distinct_devices") else "SHARED"
    return f"{plural(n, 'rank')} on {kind} devices ({', '.join(devices)})"


def losses(train: Mapping[str, Any]) -> str:
    """``final loss 0.7276, val loss 0.7012`` (what is known of them)."""
    loss, val = (train.get("final") or {}).get("train/loss"), train.get("val_loss")
    return ", ".join(([f"final loss {loss:.4f}"] if loss is not None else [])
                     + ([f"val loss {val:.4f}"] if val is not None else []))


def is_short(train: Mapping[str, Any]) -> bool:
    """Fewer than ``SHORT_STEPS`` optimizer steps."""
    return (train.get("steps") or 0) < SHORT_STEPS


def one_line(train: Mapping[str, Any], check: Mapping[str, Any], summary: str) -> str:
    """A short run's closing line: outcome, steps, losses, wall-clock and its start-up, throughput."""
    g = train.get("goodput") or {}
    parts = [plural(train.get('steps') or 0, 'step'), where(check)]
    if (text := losses(train)):
        parts.append(text)
    if g.get("wall_s") is not None:
        startup = (g.get("seconds") or {}).get("startup")
        parts.append(f"{g['wall_s']:.1f} s wall-clock" + (f" ({startup:.1f} s start-up)" if startup is not None
                                                          else ""))
    rate, unit = (g.get("tokens_per_s"), "tokens/s") if g.get("tokens_per_s") is not None \
        else (g.get("samples_per_s"), "samples/s")
    if rate is not None:
        parts.append(f"goodput {rate:,.0f} {unit}")
    return f"ddp-run: completed: {', '.join(parts)}; details: {summary}"


def gpu_note(gpus: Mapping[str, Mapping[str, float]]) -> str | None:
    """A note on a GPU clocked ``CLOCK_GAP`` or more below the fastest one, else None."""
    clocks = {r: g["sm_clock_mhz"] for r, g in gpus.items()}
    if len(clocks) < 2:
        return None
    fast = max(clocks, key=lambda r: clocks[r])
    slow = min(clocks, key=lambda r: clocks[r])
    if clocks[slow] >= (1 - CLOCK_GAP) * clocks[fast]:
        return None
    return (f"note: rank {slow}'s GPU ran {100 * (1 - clocks[slow] / clocks[fast]):.0f}% below rank {fast}'s"
            f" ({clocks[slow]:.0f} against {clocks[fast]:.0f} MHz); every step waits for the slowest GPU"
            " (TensorBoard: gpu<R>/sm_clock_mhz)")


def completed_lines(train: Mapping[str, Any], check: Mapping[str, Any], summary: str,
                    width: int | None = None) -> list[str]:
    """The console's closing lines for a completed run (``summary``: where summary.json is), fitted to a terminal
    ``width`` columns wide: sentences wrapped, the ranks' table narrowed (None: one record per line)."""
    if is_short(train):
        return textfit.wrap(one_line(train, check, summary), width)
    head = ", ".join(x for x in (plural(train.get("steps") or 0, "step"), where(check), losses(train)) if x)
    out = textfit.wrap(f"ddp-run: completed: {head}", width)
    tb, gpus = train.get("time_breakdown"), train.get("gpus") or {}
    rows = breakdown.table(tb, check.get("devices"), gpus, width=width)
    if rows:
        out += textfit.wrap("ddp-run: each rank" + (", mean per optimizer step (work: the step less its wait in the"
                                                    " gradient sync)" if tb else "") + ":", width)
        out += rows
    for line in (breakdown.slowest_line(tb), gpu_note(gpus)):
        if line:
            out += textfit.wrap(f"ddp-run: {line}", width)
    return out + textfit.wrap_all(breakdown.goodput_lines(train.get("goodput")), width)


def failed_lines(cause: Mapping[str, Any], label: str, log: str | None, logs: str, resume: list[str]) -> list[str]:
    """The console's closing lines for a failed run (``label``: ``FAILED``, or the status a stop left), unfitted:
    the cause and the user's line first, said once, with the failed rank's last frames (``log``: its log), what
    followed from it on other ranks, where the rank logs are (``logs``), and how to continue (``resume``)."""
    from ddp_runner.diagnostics import rootcause

    out = rootcause.account(cause, f"ddp-run: {label}", log)
    out += [f"ddp-run: {line}" for line in rootcause.consequence_lines(cause)]
    return [*out, f"ddp-run: rank logs: {logs}", *resume]


def job_line(train: Mapping[str, Any], job: int, width: int | None = None, run: str | None = None) -> list[str]:
    """A sweep's job closes with one line (its detail is in its summary.json; the sweep's table follows at the
    end): ``ddp-run: job 3 completed: 24 steps, final loss 1.0021, val loss 0.9, 4.6 s wall-clock``, and ``; <run>``
    where its run directory is named nowhere else."""
    g = train.get("goodput") or {}
    parts = [plural(train.get("steps") or 0, "step")]
    if (text := losses(train)):
        parts.append(text)
    if g.get("wall_s") is not None:
        parts.append(f"{g['wall_s']:.1f} s wall-clock")
    return textfit.wrap(f"ddp-run: job {job} completed: {', '.join(parts)}" + (f"; {run}" if run else ""), width)


def job_failed_line(cause: Mapping[str, Any], label: str, job: int, summary: str) -> str:
    """A failed job of a sweep run in turn, in one line: ``ddp-run: job 2 FAILED: earliest error on rank 1 […]:
    …; details: <run>/summary.json`` (its traceback is in the rank's log, the sweep's table follows at the end)."""
    from ddp_runner.diagnostics import rootcause

    return f"ddp-run: job {job} {label}: {rootcause.headline(cause)}; details: {summary}"
