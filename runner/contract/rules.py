"""Key rules both sides use: what one config key may hold (:class:`Rule`), how a task checks its own keys
(:func:`check_keys`), the plan's sentence and global-batch product, and the memory cap a run asked for.

Standard library only: the workers and the task-check hooks import it.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ddp_runner.contract import layout, stops
from ddp_runner.contract.errors import PlanError

_MISSING = object()


@dataclass(frozen=True)
class Rule:
    """What one key may hold.

    ``kind``: ``int`` | ``number`` | ``bool`` | ``str`` | ``choice`` | ``numbers`` (a list of ``length`` numbers) |
    ``mapping`` | ``signal`` (a signal's name or number that a stop may use). ``lo``/``hi`` bound numbers
    (``lo_open``/``hi_open``: strictly); ``choices`` lists the allowed values of a ``choice`` (and extra literal
    values allowed beside an ``int``, e.g. ``auto``); ``null``: None is allowed; ``example``: a valid setting for
    the fix.
    """

    key: str
    kind: str
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    choices: tuple[Any, ...] = ()
    null: bool = False
    length: int | None = None
    example: str = ""

    def problem(self, value: Any) -> str | None:
        """Why ``value`` breaks this rule; None when it is fine."""
        if value is None:
            return None if self.null else "must be set (null is not allowed)"
        if self.kind == "bool":
            return None if isinstance(value, bool) else "must be true or false"
        if self.kind == "choice":
            return None if value in self.choices else "unknown value"
        if self.kind == "str":
            return None if isinstance(value, str) and value.strip() else "must be a non-empty string"
        if self.kind == "mapping":
            return None if isinstance(value, Mapping) else "must be a mapping of settings"
        if self.kind == "signal":
            try:
                stops.parse_signal(value)
            except ValueError as exc:
                return str(exc)
            return None
        if self.kind == "numbers":
            if not isinstance(value, (list, tuple)) or (self.length is not None and len(value) != self.length):
                return f"must be a list of {self.length} numbers"
            return next((p for v in value if (p := self._number_problem(v, whole=False))), None)
        if self.kind == "int" and any(value is c if isinstance(c, bool) or isinstance(value, bool) else value == c
                                      for c in self.choices):
            return None  # a listed literal (``auto``); a bool only where that very bool is listed (``false``)
        return self._number_problem(value, whole=self.kind == "int")

    def _number_problem(self, value: Any, whole: bool) -> str | None:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (whole and not isinstance(value, int)):
            return "must be a whole number" if whole else "must be a number"
        if not math.isfinite(value):
            return "must be a finite number"
        if self.lo is not None and (value <= self.lo if self.lo_open else value < self.lo):
            return f"must be {'>' if self.lo_open else '>='} {_num(self.lo)}" + self._upper()
        if self.hi is not None and (value >= self.hi if self.hi_open else value > self.hi):
            return f"must be {'<' if self.hi_open else '<='} {_num(self.hi)}" + self._lower()
        return None

    def _upper(self) -> str:
        return f" and {'<' if self.hi_open else '<='} {_num(self.hi)}" if self.hi is not None else ""

    def _lower(self) -> str:
        return f" and {'>' if self.lo_open else '>='} {_num(self.lo)}" if self.lo is not None else ""

    def fix(self) -> str:
        """How to set this key right."""
        allowed = [str(c) for c in self.choices]
        if self.kind == "choice":
            fix = f"use one of {', '.join(allowed)}" + (" (or null)" if self.null else "")
        elif self.kind == "bool":
            fix = f"use {self.key}=true or {self.key}=false"
        else:
            fix = f"e.g. {self.key}={self.example}" if self.example else f"set {self.key} as the rule says"
            if self.null:
                fix += " (or null)"
            if allowed and self.kind == "int":
                fix += f" (or {', '.join(allowed)})"
        return fix


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def integer(key: str, lo: int | None = None, hi: int | None = None, null: bool = False, example: str = "",
            also: tuple[Any, ...] = ()) -> Rule:
    """A whole number in ``[lo, hi]`` (``also``: literal values allowed beside it, e.g. ``auto``)."""
    return Rule(key, "int", lo=lo, hi=hi, null=null, example=example, choices=also)


def number(key: str, lo: float | None = None, hi: float | None = None, lo_open: bool = False,
           hi_open: bool = False, null: bool = False, example: str = "") -> Rule:
    """A finite number between ``lo`` and ``hi`` (``*_open``: strictly)."""
    return Rule(key, "number", lo=lo, hi=hi, lo_open=lo_open, hi_open=hi_open, null=null, example=example)


def flag(key: str, null: bool = False) -> Rule:
    """true or false."""
    return Rule(key, "bool", null=null)


def choice(key: str, choices: Iterable[Any], null: bool = False) -> Rule:
    """One of ``choices``."""
    return Rule(key, "choice", choices=tuple(choices), null=null)


def text(key: str, null: bool = False, example: str = "") -> Rule:
    """A non-empty string."""
    return Rule(key, "str", null=null, example=example)


def stop_signal(key: str, example: str) -> Rule:
    """A signal a stop may use: its name (``SIGUSR2``, ``USR2``) or number, not one the job needs otherwise."""
    return Rule(key, "signal", null=True, example=example)


def get(cfg: Mapping[str, Any], dotted: str, default: Any = None) -> Any:
    """The value at ``a.b.c`` in nested mappings; ``default`` when any part is absent."""
    node: Any = cfg
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return default
        node = node[part]
    return node


def check_keys(cfg: Mapping[str, Any], rules: Iterable[Rule]) -> None:
    """Refuse the first key whose value breaks its rule (absent keys are skipped)."""
    for rule in rules:
        value = get(cfg, rule.key, _MISSING)
        if value is _MISSING:
            continue
        if (problem := rule.problem(value)) is not None:
            raise PlanError(rule.key, value, problem, rule.fix())


def global_batch(per_rank: int, world_size: int, accumulation: int) -> int:
    """The one place the product is written: samples per optimizer step over all ranks."""
    return per_rank * world_size * accumulation


def explain(global_batch: int, per_rank: int, world_size: int, accumulation: int) -> str:
    """The plan's sentence, the one place it is worded: ``global batch 32 = 8 per rank × 2 ranks × 2 accumulation``."""
    ranks = "rank" if world_size == 1 else "ranks"
    return f"global batch {global_batch} = {per_rank} per rank × {world_size} {ranks} × {accumulation} accumulation"


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"triton": {"cudagraphs": True}}`` -> ``{"triton.cudagraphs": True}``."""
    out: dict[str, Any] = {}
    for k, v in tree.items():
        if isinstance(v, Mapping):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def asked_cap_gb(cfg: Mapping[str, Any]) -> tuple[float | None, str]:
    """The cap asked for (``strategy.memory_cap_gb``, else ``$DDP_RUNNER_MEMORY_CAP_GB``) and where it came from;
    None when neither is set. The workers hold their GPU to it (tasks/engine/rank.py)."""
    scfg = cfg.get("strategy") or {}
    if scfg.get("memory_cap_gb") is not None:
        return float(scfg["memory_cap_gb"]), "strategy.memory_cap_gb"
    if os.environ.get(layout.ENV_MEMORY_CAP_GB):
        return float(os.environ[layout.ENV_MEMORY_CAP_GB]), layout.ENV_MEMORY_CAP_GB
    return None, ""
