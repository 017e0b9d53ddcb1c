"""Series in summary.json stay small however long a run is: at most :data:`MAX_POINTS` points each.

A series longer than that is cut into buckets of consecutive points, and each bucket keeps its smallest and its
largest value (in step order), with the first and the last point of the whole series: the curve's shape, its
spikes, its best loss (``min``) and its final one (``[-1]``) survive, and readers that take those need no change.
Each kept value's step travels beside it. The full series is in TensorBoard (``tb/``). Standard library only:
the worker writes these, the driver's readers (ddp-compare, ddp-runs) read them.
"""

from __future__ import annotations

from collections.abc import Sequence

MAX_POINTS = 256  # per series: about 6 KB of JSON for a loss series with its steps


def kept_indices(values: Sequence[float], max_points: int = MAX_POINTS) -> list[int]:
    """Indices of ``values`` to keep: all of them up to ``max_points``; else the first, the last, and the smallest
    and largest of each of ``(max_points - 2) // 2`` buckets in between, in order."""
    n = len(values)
    if n <= max_points:
        return list(range(n))
    if max_points < 4:
        raise ValueError(f"max_points={max_points}: keeping the first, the last and a bucket needs at least 4")
    buckets = (max_points - 2) // 2
    inner = n - 2
    kept = {0, n - 1}
    for b in range(buckets):
        lo, hi = 1 + b * inner // buckets, 1 + (b + 1) * inner // buckets
        if lo >= hi:
            continue
        span = range(lo, hi)
        kept.add(min(span, key=lambda i: (_order(values[i]), i)))
        kept.add(max(span, key=lambda i: (_order(values[i]), -i)))
    return sorted(kept)


def _order(v: float | None) -> float:
    """A value's place in min/max: a missing or NaN value (a diverged loss) sorts as the largest, so it is kept."""
    return float("inf") if v is None or v != v else v


def bounded(values: Sequence[float], steps: Sequence[int], max_points: int = MAX_POINTS
            ) -> tuple[list[float], list[int]]:
    """``values`` and their ``steps``, at most ``max_points`` of each (:func:`kept_indices`)."""
    if len(values) != len(steps):
        raise ValueError(f"{len(values)} values against {len(steps)} steps")
    keep = kept_indices(values, max_points)
    return [values[i] for i in keep], [steps[i] for i in keep]


def log_steps(count: int, log_every: int, total_steps: int | None) -> list[int]:
    """The optimizer step of each of ``count`` logged values: one every ``log_every`` steps, the last at
    ``total_steps`` (the engine always logs the final step)."""
    steps = [(i + 1) * log_every for i in range(count)]
    if steps and total_steps:
        steps[-1] = min(steps[-1], total_steps)
    return steps
