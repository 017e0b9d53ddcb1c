"""What a sweep job returns to Hydra: its objective, the number a search sweeper (Optuna, Nevergrad, Ax) optimises.

``sweep.objective`` names it (default ``val_loss``, the final validation loss), ``sweep.direction`` says which way
is better (``minimize``/``maximize``; set the sweeper's own direction to the same). A job that failed, was refused
or never ran returns :class:`Failed`: search sweepers record it as a failed trial and go on (Optuna:
``TrialState.FAIL``), instead of a crash on ``None``.

A job of a concurrent or a Slurm sweep is still running when Hydra's launcher returns: it returns a
:class:`Pending` objective, a float whose value is waited for when the sweeper reads it (``float(x)``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

DEFAULT = "val_loss"
# Names that are not keys of summary.json as written: the last train loss, and the median figures.
_DERIVED = {"final_loss": lambda s: (s.get("losses") or [None])[-1],
            "tokens_per_s": lambda s: (s.get("median") or {}).get("tokens_per_s"),
            "step_time_s": lambda s: (s.get("median") or {}).get("step_time_s")}


def value_of(summary: Mapping[str, Any] | None, key: str) -> float | None:
    """The objective ``key`` in a run's summary.json: ``val_loss``, ``final_loss``, ``tokens_per_s``,
    ``step_time_s``, a task metric's name (``metrics.<name>``, or the bare name), a ``final`` scalar
    (``perf/step_time_s``), or any dotted path into summary.json. None when the run has no such number."""
    if not summary:
        return None
    found: Any = None
    if key in _DERIVED:
        found = _DERIVED[key](summary)
    else:
        for where in (summary, summary.get("metrics") or {}, summary.get("final") or {}):
            if key in where:
                found = where[key]
                break
        else:
            found = summary
            for part in key.split("."):
                found = found.get(part) if isinstance(found, Mapping) else None
    if isinstance(found, bool) or not isinstance(found, (int, float)) or not math.isfinite(found):
        return None
    return float(found)


def best(jobs: Sequence[Mapping[str, Any]], direction: str) -> Mapping[str, Any] | None:
    """The job with the best finite ``objective`` (ties: the earliest), or None."""
    scored = [j for j in jobs if isinstance(j.get("objective"), (int, float)) and math.isfinite(j["objective"])]
    if not scored:
        return None
    sign = -1.0 if direction == "maximize" else 1.0
    return min(scored, key=lambda j: (sign * j["objective"], j["job"]))


class Failed:
    """The objective of a job that has none (failed, refused, not run, or its summary lacks the metric): reading
    it as a number raises ``ValueError`` with the reason, which a search sweeper records as a failed trial
    (hydra-optuna-sweeper: ``TrialState.FAIL``, and the search goes on) instead of a value it would optimise."""

    def __init__(self, why: str) -> None:
        self.why = why

    def __float__(self) -> float:
        raise ValueError(self.why)

    def __repr__(self) -> str:
        return f"Failed({self.why!r})"


def returned(value: float | None, why: str) -> float | Failed:
    """What a job returns to Hydra: its objective, or :class:`Failed` with ``why``."""
    return value if value is not None else Failed(why)


class Pending:
    """An objective still being computed: ``float(p)`` (what a sweeper does) waits for ``resolve`` (once), which
    returns the job's objective or :class:`Failed`."""

    def __init__(self, resolve: Callable[[], float | Failed]) -> None:
        self._resolve = resolve
        self._value: float | Failed | None = None

    def value(self) -> float | Failed:
        """Wait for the job; its objective, or :class:`Failed`."""
        if self._value is None:
            self._value = self._resolve()
        return self._value

    def __float__(self) -> float:
        return float(self.value())

    def __repr__(self) -> str:
        return repr(self._value) if self._value is not None else "Pending()"
