"""What an early-stopping search's record adds to sweep.json and sweep.md (and ddp-compare's trials): each trial's
state (completed, pruned at step N, failed), and the optimizer steps the pruning saved against running every
trial to its end. Pure."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

# Statuses of a trial that the search did not end: a stop (Ctrl-C, pre-emption) cut it short, or it never started.
STOPPED = ("interrupted", "preempted", "not run")


def trial_state(record: Mapping[str, Any]) -> str:
    """A sweep job's state as a trial: ``completed`` (with a finite objective), ``pruned``, ``stopped`` (a stop
    cut it short or it never started: a continued search runs it again), or ``failed`` (failed, refused, or
    completed without its objective: a diverged loss)."""
    status = record.get("status")
    value = record.get("objective")
    if status == "completed" and isinstance(value, (int, float)) and math.isfinite(value):
        return "completed"
    return "pruned" if status == "pruned" else "stopped" if status in STOPPED else "failed"


def state_text(job: Mapping[str, Any]) -> str:
    """``completed``, ``pruned at step 40``, ``failed``, … (a job's status, with the step a pruned one was stopped
    at: its last validation; its checkpoint is of the step its ranks stopped after)."""
    status = str(job.get("status"))
    pruned = job.get("pruned")
    if status == "pruned" and isinstance(pruned, Mapping) and isinstance(pruned.get("step"), int):
        return f"pruned at step {pruned['step']}"
    return status


def full_steps(jobs: Sequence[Mapping[str, Any]]) -> int | None:
    """The steps one trial plans when it runs to its end: the most a job planned (its progress records), else
    the most a completed job ran; None when no job says."""
    planned = [j["planned_steps"] for j in jobs if isinstance(j.get("planned_steps"), int)]
    ran = [(j.get("figures") or {}).get("steps") for j in jobs if j.get("status") == "completed"]
    found = planned or [s for s in ran if isinstance(s, int)]
    return max(found) if found else None


def steps_saved(jobs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The optimizer steps the trials ran, the steps they would have run had no trial been pruned (a pruned one
    to its end: the steps it planned, else :func:`full_steps`; a completed or failed one as it ran; one a stop cut
    short is left out of both), and the difference (``saved``, and as a fraction of ``unpruned``)."""
    full = full_steps(jobs)
    counted = [j for j in jobs if j.get("run_dir") and trial_state(j) != "stopped"]
    steps = [int((j.get("figures") or {}).get("steps") or 0) for j in counted]
    ran = sum(steps)
    if full is None:
        return {"ran": ran, "unpruned": None, "saved": None, "saved_fraction": None}
    saved = sum(max(0, (j["planned_steps"] if isinstance(j.get("planned_steps"), int) else full) - n)
                for j, n in zip(counted, steps, strict=True) if trial_state(j) == "pruned")
    unpruned = ran + saved
    return {"ran": ran, "unpruned": unpruned, "saved": saved,
            "saved_fraction": round(saved / unpruned, 4) if unpruned else None}


def summary(jobs: Sequence[Mapping[str, Any]], settings: Mapping[str, Any]) -> dict[str, Any]:
    """sweep.json's ``search``: the pruner and the study's file, the trials by state, the steps saved."""
    states: dict[str, int] = {}
    for j in jobs:
        key = trial_state(j)
        states[key] = states.get(key, 0) + 1
    return {**settings, "trials": states, "steps": steps_saved(jobs)}


def markdown_lines(search: Mapping[str, Any]) -> list[str]:
    """sweep.md's (and ddp-compare's) lines on the search: its pruner, the trials by state, the steps saved."""
    states = ", ".join(f"{n} {s}" for s, n in sorted((search.get("trials") or {}).items()))
    steps = search.get("steps") or {}
    lines = [f"Search: pruner {search.get('pruner')}; trials: {states or 'none'}."]
    if steps.get("unpruned"):
        lines.append(f"Optimizer steps: {steps['ran']} run of {steps['unpruned']} had every trial run to its end"
                     f" (saved {steps['saved']}, {100 * (steps.get('saved_fraction') or 0):.0f}%).")
    return lines
