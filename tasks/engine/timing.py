"""Where each optimizer step's time goes on this rank: data, compute, exposed gradient sync, optimizer.

The loop marks the boundaries of a step's phases; each mark ends the interval since the previous one and names
what that interval was:

    step start ─data─► batch on the device ─compute─► backward done ─data─► … ─compute─► last bucket's
    gradients ready ─exposed_sync─► backward returned ─optimizer─► step done

The intervals are contiguous, so the four phases add up to the step. On a GPU the marks are CUDA events on the
compute stream, so every interval is *device* time, idle gaps included: ``data`` is how long the GPU waited for its
input (zero while the host's data loading hides behind queued work, plus the host-to-device copy), ``compute`` the
forward and backward kernels (and any launch-bound gaps between them), ``optimizer`` clipping and the update.

Exposed sync, without a profiler: on the synchronising micro-step, DDP calls its communication hook for the last
bucket as soon as the last gradient of the backward exists (buckets are reduced in order; the last one holds
the first layers' parameters, whose gradients come last). The strategy calls :meth:`PhaseTimer.grads_ready`
there, which marks the end of backward compute on the compute stream. ``backward()`` returns only once DDP has
made the compute stream wait for every bucket's all-reduce, so the interval from that mark to the end of the
micro-step is exactly the communication that was not hidden behind the backward (and, on a rank that finished
its backward early, the wait for slower ranks). World size 1 has no hook and no sync.

Cost: a few event records per micro-step and no synchronisation. A step's events are read once its last one has
completed (``query()``, never a wait), a step or two later. On the CPU the marks are ``perf_counter`` readings.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

PHASES = ("data", "compute", "exposed_sync", "optimizer")
# What one window reports per rank, in this order (also the order of the values gathered from every rank).
FIELDS = ("data_ms", "compute_ms", "exposed_sync_ms", "optimizer_ms", "step_ms")


@dataclass
class _Step:
    """The marks of one sampled optimizer step: (phase the interval ends, event or perf_counter reading)."""

    start: Any
    marks: list[tuple[str, Any]] = field(default_factory=list)


class PhaseTimer:
    """Marks phase boundaries of sampled optimizer steps and turns them into per-window mean phase times (ms).

    ``every``: time every Nth optimizer step (0: off, every call is a no-op). The first step of a launch
    (compilation) is never sampled.
    """

    def __init__(self, device: torch.device, every: int, first_step: int) -> None:
        self.every, self.first_step = every, first_step
        self.cuda = device.type == "cuda"
        self._pool: list[Any] = []           # CUDA events whose step has been read, for reuse
        self._current: _Step | None = None   # the step being marked
        self._pending: list[_Step] = []      # marked steps not yet read
        self._window: list[dict[str, float]] = []  # read steps of the current window
        self._sync_seen = False              # grads_ready was marked in the current micro-step

    # -- marking (the loop and the strategy call these) ---------------------------------------------------

    def _now(self) -> Any:
        if not self.cuda:
            return time.perf_counter()
        ev = self._pool.pop() if self._pool else torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def begin_step(self, step: int) -> None:
        """Start optimizer step ``step`` (1-based); read any earlier step whose events have completed."""
        self._read_ready()
        on = self.every > 0 and step > self.first_step and step % self.every == 0
        self._current = _Step(self._now()) if on else None

    def mark(self, phase: str) -> None:
        """End an interval of ``phase`` (one of :data:`PHASES`) now."""
        if self._current is not None:
            self._current.marks.append((phase, self._now()))

    def grads_ready(self) -> None:
        """The backward's last gradient exists and its all-reduce is about to start (called by the strategy)."""
        if self._current is not None:
            self.mark("compute")
            self._sync_seen = True

    def end_micro_step(self) -> None:
        """After a micro-step's backward: the rest was compute, or, after :meth:`grads_ready`, waiting for sync."""
        self.mark("exposed_sync" if self._sync_seen else "compute")
        self._sync_seen = False

    def end_step(self) -> None:
        """After the optimizer step."""
        self.mark("optimizer")
        if self._current is not None:
            self._pending.append(self._current)
            self._current = None

    # -- reading ----------------------------------------------------------------------------------------

    def _done(self, rec: _Step) -> bool:
        # The last mark first (cheap, and usually the answer); then every one: the strategy's mark may come from
        # another thread's stream.
        return not self.cuda or (rec.marks[-1][1].query() and all(ev.query() for _, ev in rec.marks))

    def _read_ready(self) -> None:
        while self._pending and self._done(self._pending[0]):
            rec = self._pending.pop(0)
            self._window.append(phase_times(rec.start, rec.marks, self._elapsed_ms))
            if self.cuda:
                self._pool += [rec.start, *(ev for _, ev in rec.marks)]

    def _elapsed_ms(self, a: Any, b: Any) -> float:
        return a.elapsed_time(b) if self.cuda else 1000.0 * (b - a)

    def window(self) -> dict[str, float] | None:
        """Mean phase times (ms) of the steps read since the last call, or None when none was; a new window."""
        self._read_ready()
        out = window_means(self._window)
        self._window = []
        return out


class DeviceClock:
    """Logging-window boundaries as CUDA events on the compute stream (``metrics.StepMeter``'s clock on a GPU): the
    time between two is the device's, idle gaps included, whatever the host was doing when it read them."""

    def mark(self) -> Any:
        """A boundary after the work queued so far."""
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def seconds(self, start: Any, end: Any) -> float:
        """Seconds from ``start`` to ``end`` (waits for ``end``; the engine reads it after the log step's values,
        queued after it, so it is done)."""
        end.synchronize()
        return start.elapsed_time(end) / 1000.0


def phase_times(start: Any, marks: Sequence[tuple[str, Any]], elapsed_ms: Any) -> dict[str, float]:
    """``{data_ms, compute_ms, exposed_sync_ms, optimizer_ms, step_ms}`` of one step from its marks: each interval
    counts for the phase its ending mark names; ``step_ms`` is their sum (start to the last mark)."""
    out = dict.fromkeys(FIELDS, 0.0)
    prev = start
    for phase, t in marks:
        dt = elapsed_ms(prev, t)
        out[f"{phase}_ms"] += dt
        out["step_ms"] += dt
        prev = t
    return out


def window_means(steps: Sequence[Mapping[str, float]]) -> dict[str, float] | None:
    """Mean of each field over ``steps`` (None for none)."""
    if not steps:
        return None
    return {k: statistics.fmean(s[k] for s in steps) for k in FIELDS}


def slowest_fastest(per_rank: Mapping[str, Mapping[str, float]]) -> tuple[str, str, float | None]:
    """The slowest and fastest rank by work per step (step time minus exposed sync), and the gap in percent.

    In DDP every rank's step lasts as long as the slowest one's: the faster ranks spend the difference waiting in
    the gradient sync, so the work, not the step, tells the ranks apart.
    """
    work = {r: v["step_ms"] - v["exposed_sync_ms"] for r, v in per_rank.items()}
    slow, fast = max(work, key=work.get), min(work, key=work.get)
    return slow, fast, (100.0 * (work[slow] - work[fast]) / work[fast] if work[fast] > 0 else None)


def scalars(windows: Mapping[int, Mapping[str, float]]) -> dict[str, float]:
    """TensorBoard scalars of one logging window: ``time/rank<R>/<field>`` for every rank, and ``time/gap_pct``
    between the slowest and the fastest rank."""
    out = {f"time/rank{r}/{k}": v for r, w in sorted(windows.items()) for k, v in w.items()}
    if len(windows) > 1:
        _, _, gap = slowest_fastest({str(r): w for r, w in windows.items()})
        if gap is not None:
            out["time/gap_pct"] = gap
    return out


def summarize(windows: Mapping[int, Sequence[Mapping[str, float]]], every: int) -> dict[str, Any] | None:
    """``summary.json``'s ``time_breakdown`` from every rank's window means.

    Per rank, the mean of each field over its windows but the first (warm-up; all of them when there is only
    one): means, not medians, so that the phases still add up to the step. Slowest and fastest rank:
    :func:`slowest_fastest`; ``gap_pct``: how much more work the slowest rank has than the fastest. ``shares``: the
    slowest rank's phases as fractions of its step; its exposed sync is the communication nobody hid.
    """
    per_rank: dict[str, dict[str, float]] = {}
    for rank, ws in sorted(windows.items()):
        kept = list(ws[1:] or ws)
        if kept:
            per_rank[str(rank)] = {k: statistics.fmean(w[k] for w in kept) for k in FIELDS}
    if not per_rank:
        return None
    slow, fast, gap = slowest_fastest(per_rank)
    step = per_rank[slow]["step_ms"]
    shares = {p: (per_rank[slow][f"{p}_ms"] / step if step > 0 else None) for p in PHASES}
    # One logging window only: its steps include the warm-up (CUDA-graph recording, allocator growth), which
    # can make one rank look several times slower than it is; readers are told.
    warmup = all(len(ws) <= 1 for ws in windows.values())
    return {"per_rank": per_rank, "slowest_rank": int(slow), "fastest_rank": int(fast), "gap_pct": gap,
            "shares": shares, "sampled_every": every, "warmup_included": warmup}
