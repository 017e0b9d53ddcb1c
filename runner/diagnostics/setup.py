"""The driver's side of ``watchdog.*``, ``fault.*`` and ``debug``: checked before launch, turned into the workers'
environment, and the run tree's diagnostics folders made (private where they must be).

Standard library only at import (the driver never imports torch at start-up).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from runner.contract import layout
from runner.contract.errors import PlanError

FAULT_KINDS = ("exception", "oom", "sigkill", "hang", "slow")
# NCCL flight recorder entries kept per rank (torch's TORCH_NCCL_TRACE_BUFFER_SIZE; 0 = off): a few thousand
# collectives are enough to see which one a rank never joined, at a negligible cost.
NCCL_TRACE_ENTRIES = "2000"


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


WATCHDOG_MAX_AUTO_S = 120.0


def resolve(conf: dict[str, Any]) -> None:
    """``watchdog.timeout_s: auto`` becomes half the collective timeout, at most 120 s (the workers see a number)."""
    wd = conf.setdefault("watchdog", {})
    if wd.get("timeout_s", "auto") == "auto":
        timeout = conf.get("timeout_s")
        wd["timeout_s"] = min(WATCHDOG_MAX_AUTO_S, timeout / 2) if _number(timeout) and timeout > 0 \
            else WATCHDOG_MAX_AUTO_S


def check(conf: Mapping[str, Any], world_size: int) -> None:
    """Refuse bad ``watchdog.*``, ``fault.*`` or ``debug`` values (PlanError: key, value, problem, fix)."""
    timeout = conf.get("timeout_s")
    wd = (conf.get("watchdog") or {}).get("timeout_s", 0)
    if not _number(wd) or wd < 0:
        raise PlanError("watchdog.timeout_s", wd, "must be a number of seconds >= 0",
                        "e.g. watchdog.timeout_s=120, or auto (half of timeout_s, at most 120 s), or 0 (off)")
    if wd and _number(timeout) and wd >= timeout:
        raise PlanError("watchdog.timeout_s", wd, f"not below the collective timeout timeout_s={timeout}: the"
                        " collective timeout would end the run first, without stacks or the stuck rank's name",
                        f"use a value well below timeout_s, e.g. watchdog.timeout_s={max(1, int(timeout) // 5)},"
                        " or raise timeout_s")
    debug = conf.get("debug", False)
    if not isinstance(debug, bool):
        raise PlanError("debug", debug, "must be true or false", "use debug=true or debug=false")
    fault = conf.get("fault") or {}
    if fault.get("kind") is None:
        return
    also = fault.get("also") or []
    if not isinstance(also, list) or not all(isinstance(f, Mapping) for f in also):
        raise PlanError("fault.also", also, "must be a list of faults with the keys kind, rank, step (slow_s)",
                        "e.g. fault.also=[{kind:hang,rank:0,step:5}]")
    max_steps = (conf.get("train") or {}).get("max_steps")
    for key, f in [("fault", fault), *((f"fault.also[{i}]", f) for i, f in enumerate(also))]:
        _check_fault(key, f, world_size, max_steps)


def _check_fault(key: str, fault: Mapping[str, Any], world_size: int, max_steps: Any) -> None:
    kind = fault.get("kind")
    if kind not in FAULT_KINDS:
        raise PlanError(f"{key}.kind", kind, "unknown fault", f"use one of {', '.join(FAULT_KINDS)}, or null (off)")
    rank = fault.get("rank")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
        raise PlanError(f"{key}.rank", rank, f"not a rank of this run (world_size={world_size})",
                        f"use a rank from 0 to {world_size - 1}")
    step = fault.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or step < 1:
        raise PlanError(f"{key}.step", step, "must be an optimizer step >= 1 (the fault strikes after it)",
                        f"e.g. {key}.step=3")
    if isinstance(max_steps, int) and step > max_steps:
        raise PlanError(f"{key}.step", step, f"after the last step (train.max_steps={max_steps}): it would never"
                        " strike", f"use {key}.step={max_steps} or lower")
    slow = fault.get("slow_s")
    if kind == "slow" and (not _number(slow) or slow <= 0):
        raise PlanError(f"{key}.slow_s", slow, "fault.kind=slow needs a positive number of seconds per step",
                        f"e.g. {key}.slow_s=5")


def without_fault(conf: dict[str, Any]) -> bool:
    """Turn a rehearsal fault off (a continued run does not repeat it); True if one was on."""
    fault = conf.get("fault") or {}
    if fault.get("kind") is None:
        return False
    fault["kind"] = None
    return True


FLIGHT_RECORDER_VARIABLES = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")


def flight_recorder_variable() -> str:
    """The name the installed torch reads for the flight recorder's size (read from its metadata and source, not
    imported: the driver never imports torch)."""
    version, source = None, ""
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        version = importlib.metadata.version("torch")
    spec = importlib.util.find_spec("torch")
    if spec is not None and spec.origin:
        with contextlib.suppress(OSError):
            source = Path(spec.origin).parent.joinpath("distributed", "distributed_c10d.py").read_text()
    return flight_recorder_variable_for(version, source)


def flight_recorder_variable_for(version: str | None, c10d_source: str) -> str:
    """``TORCH_FR_BUFFER_SIZE`` from torch 2.8 on (its C++ side then warns on every rank about the older
    ``TORCH_NCCL_TRACE_BUFFER_SIZE``, even where its Python side does not name the new one, as in 2.11), or when
    ``distributed_c10d.py`` names it; else the older name."""
    if FLIGHT_RECORDER_VARIABLES[0] in c10d_source:
        return FLIGHT_RECORDER_VARIABLES[0]
    m = re.match(r"(\d+)\.(\d+)", version or "")
    if m and (int(m.group(1)), int(m.group(2))) >= (2, 8):
        return FLIGHT_RECORDER_VARIABLES[0]
    return FLIGHT_RECORDER_VARIABLES[1]


def worker_env(conf: Mapping[str, Any], backend: str) -> dict[str, str]:
    """Variables the workers need for debug mode and NCCL's flight recorder (existing user settings win)."""
    env: dict[str, str] = {}
    if backend == "nccl" and (conf.get("watchdog") or {}).get("timeout_s"):
        name = flight_recorder_variable()
        if not any(os.environ.get(v) for v in FLIGHT_RECORDER_VARIABLES):
            env[name] = NCCL_TRACE_ENTRIES
    if conf.get("debug"):
        env.update({layout.ENV_DEBUG: "1", "NCCL_DEBUG": "INFO", "TORCH_DISTRIBUTED_DEBUG": "DETAIL",
                    "TORCH_CPP_LOG_LEVEL": "INFO"})
    return env


def prepare(local_dir: str, conf: Mapping[str, Any]) -> None:
    """Make the diagnostics folders in the local run tree: progress, stacks and (debug) the owner-only debug logs."""
    for rel in (layout.PROGRESS, layout.STACKS):
        folder = os.path.join(local_dir, rel)
        os.makedirs(folder, exist_ok=True)
        if rel == layout.PROGRESS:  # a continued run: the previous launch's records (and pids) are not this one's
            for name in os.listdir(folder):
                os.remove(os.path.join(folder, name))
    for rel in (layout.HANG_RECORD, layout.DUMP_REQUEST):  # an earlier launch's (staged back from a remote tree)
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(local_dir, rel))
    if conf.get("debug"):
        path = os.path.join(local_dir, layout.DEBUG_LOGS)
        os.makedirs(path, mode=0o700, exist_ok=True)
        os.chmod(path, 0o700)  # whatever the umask


def tidy(local_dir: str) -> None:
    """After the run: drop empty stack files (every rank opens one in case the watchdog asks) and the folders
    left empty, and the dump request."""
    for rel in (layout.STACKS, layout.PROGRESS):
        folder = os.path.join(local_dir, rel)
        if not os.path.isdir(folder):
            continue
        for name in os.listdir(folder):
            p = os.path.join(folder, name)
            if name.startswith(".") or (os.path.isfile(p) and os.path.getsize(p) == 0):
                os.remove(p)
        if rel == layout.STACKS and not os.listdir(folder):
            os.rmdir(folder)
