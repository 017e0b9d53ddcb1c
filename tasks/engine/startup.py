"""When each part of a launch's start-up ended, on this rank (no torch import: the worker's entry marks its start).

The driver puts its own start (``DDP_RUNNER_T0``) and torchrun's start (``DDP_RUNNER_LAUNCH_T``) in the workers'
environment; the worker marks its own milestones here. :func:`parts` turns them into seconds per part, so that a
slow start-up says where it went (the driver's checks, torchrun and the interpreter, imports, the process group,
the model and data, the first step's compilation).
"""

from __future__ import annotations

import os
import time

from ddp_runner.contract import layout

# (mark, what the time from the previous mark was spent on), in the order they happen
PARTS = (("launch", "driver"), ("worker_start", "agent"), ("imports", "imports"),
         ("process_group", "process_group"), ("ready", "build"), ("loop_start", "loop_setup"))

_marks: dict[str, float] = {}


def mark(name: str, when: float | None = None) -> None:
    """Milestone ``name`` is reached now (or at ``when``, Unix seconds)."""
    _marks[name] = time.time() if when is None else when


def marked(name: str) -> float:
    """When milestone ``name`` was reached (Unix seconds)."""
    return _marks[name]


def parts() -> dict[str, float]:
    """Seconds per part of the start-up, up to the loop's start (parts whose ends are unknown are left out)."""
    marks = dict(_marks)
    for name, env in (("t0", layout.ENV_T0), ("launch", layout.ENV_LAUNCH_T)):
        if env in os.environ:
            marks.setdefault(name, float(os.environ[env]))
    out: dict[str, float] = {}
    prev = marks.get("t0")
    for name, part in PARTS:
        end = marks.get(name)
        if end is None:
            continue
        if prev is not None:
            out[part] = max(0.0, end - prev)
        prev = end
    return out
