"""The diagnostics keys, checked before launch: ``watchdog.timeout_s`` (``auto`` resolved), ``debug`` and the
rehearsal faults ``fault.*`` (``fault.also`` for several)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ddp_runner.contract.errors import PlanError

FAULT_KINDS = ("exception", "oom", "sigkill", "hang", "slow")
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
