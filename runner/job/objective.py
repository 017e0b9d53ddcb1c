"""What a sweep job returns to Hydra: its objective, the number a search sweeper (Optuna, Nevergrad, Ax) optimises.

``sweep.objective`` names it (default ``val_loss``, the final validation loss), ``sweep.direction`` says which way
is better (``minimize``/``maximize``; set the sweeper's own direction to the same). A job that failed, was refused
or never ran returns :class:`Failed`: search sweepers record it as a failed trial and go on (Optuna:
``TrialState.FAIL``), instead of a crash on ``None``.

A job of a concurrent or a Slurm sweep is still running when Hydra's launcher returns: it returns a
:class:`Pending` objective, whose value is waited for when the sweeper reads it (``float(x)``). The value itself
is read from the job's summary.json by :func:`ddp_runner.report.sweep.value_of`.
"""

from __future__ import annotations

from collections.abc import Callable


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
