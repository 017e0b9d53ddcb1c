"""``resume=last``: which unfinished run under ``output.root`` a job continues.

Keys given beside it that a continued run could not take choose the run: a config group (``task=gpt``,
``data=text``: the run's choice of it), ``world_size``, and every key the checkpoint fixes (``train.lr``,
``seed``, ``task.model.*`` …: runner/rundir/resume_keys.py). The newest unfinished run whose values match is
continued; when none does, the resume is refused, naming the candidates and their values. Every other key given
applies to the chosen run from the step it continues at, as with ``resume=<run dir>``; the keys that only say how
to continue (:data:`CONTINUE_KEYS`) choose nothing.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import fsspec

from ddp_runner.contract import secrets
from ddp_runner.contract.errors import PlanError
from ddp_runner.contract.rules import flatten
from ddp_runner.rundir import records, resume_keys
from ddp_runner.rundir.resume import LAST, iter_unfinished

# What a continued run takes from the command line; everything else is its own config.yaml.
CONTINUE_KEYS = ("resume", "output.root", "dry_run", "train.max_steps")
ABSENT = "<absent>"
_SHOWN = 5  # candidates a refusal names


@dataclass(frozen=True)
class Wanted:
    """What the keys beside ``resume=last`` ask of the run: ``values`` (key -> value) and the overrides they came
    from (``given``)."""

    values: dict[str, Any]
    given: list[str]

    def __str__(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.values.items())


def wanted(overrides: list[str], composed: Mapping[str, Any]) -> Wanted:
    """The keys among ``overrides`` (Hydra's, as typed) that choose the run, with the values ``composed`` gives them:
    a group as its choice (``task``: the preset's name, another group its ``name``), ``world_size`` and the keys
    the checkpoint fixes as composed (a local relative ``data.path`` made absolute, as a run records it)."""
    flat, values, given = flatten(composed), {}, []
    for o in overrides:
        if "=" not in o or o.startswith("~"):
            continue
        key, value = o.split("=", 1)
        key = key.lstrip("+")
        if key in CONTINUE_KEYS or key.startswith(("hydra", "fault")):
            continue
        if "." not in key and isinstance(composed.get(key), Mapping):  # a config group
            if key == "task" or "name" in composed[key]:
                values[key] = value if key == "task" else composed[key]["name"]
                given.append(o)
        elif key in flat and (key == "world_size" or resume_keys.is_fixed(key)):
            values[key] = _as_recorded(key, flat[key])
            given.append(o)
    return Wanted(values, given)


def _as_recorded(key: str, value: Any) -> Any:
    """``value`` of ``key`` as config.yaml records it: local data paths absolute."""
    if key in ("data.path", "data.val_path") and isinstance(value, str) and value and "://" not in value:
        return os.path.abspath(os.path.expanduser(value))
    return value


def recorded(run: str, keys: list[str]) -> dict[str, Any] | None:
    """The run's values of ``keys`` (``task``: the preset it was started with, else its task's name; another group:
    its ``name``); None when its config.yaml or run.json cannot be read (it matches nothing)."""
    fs, path = fsspec.core.url_to_fs(run)
    try:
        conf = records.read_config(fs, path.rstrip("/"), complete=False)
        preset = (records.read_manifest(fs, path.rstrip("/")).get("invocation") or {}).get("task_preset")
    except (records.DamagedFile, OSError, ValueError):
        return None
    flat, out = flatten(conf), {}
    for key in keys:
        if key == "task":
            out[key] = preset or flat.get("task.name", ABSENT)
        elif isinstance(conf.get(key), Mapping):
            out[key] = conf[key].get("name", ABSENT)
        else:
            out[key] = flat.get(key, ABSENT)
    return out


def same(a: Any, b: Any) -> bool:
    """Equal as a run records them: numbers by value (``3e-4`` is ``0.0003``), URLs with their credentials masked."""
    if isinstance(a, str) and isinstance(b, str):
        return secrets.redact_urls(a) == secrets.redact_urls(b)
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return float(a) == float(b)
    return a == b


def choose(root: str, composed: Mapping[str, Any], overrides: list[str]) -> tuple[str, Wanted]:
    """The run ``resume=last`` continues: the newest unfinished run under ``root`` (with a checkpoint) whose values
    match what the keys beside it ask (:func:`wanted`), and what they asked. PlanError when there is none."""
    want = wanted(overrides, composed)
    seen: list[str] = []
    for run, state, _ in iter_unfinished(root):
        if not want.values:
            return run, want
        theirs = recorded(run, list(want.values))
        if theirs is not None and all(same(theirs[k], v) for k, v in want.values.items()):
            return run, want
        has = ", ".join(f"{k}={theirs[k]}" for k in want.values) if theirs else "config.yaml unreadable"
        seen.append(f"{run} ({state}; {has})")
    if not seen:
        raise PlanError("resume", LAST, f"no unfinished run with a checkpoint under output.root={root}",
                        "name the run directory (resume=<run dir>), or start a new run (resume=auto)")
    more = f", and {len(seen) - _SHOWN} more" if len(seen) > _SHOWN else ""
    raise PlanError("resume", LAST, f"no unfinished run under output.root={root} has {want}; the unfinished runs"
                    f" there: {', '.join(seen[:_SHOWN])}{more}",
                    "continue one of them by name (resume=<run dir>), give the values of the one you mean, or start"
                    f" a new run with {want} (resume=auto)")
