"""Efficiency arithmetic: throughput, MFU against a device's stated peak. Pure functions."""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

# Dense peak FLOP/s by device name fragment and compute dtype (vendor datasheets, no sparsity).
# A device or dtype not listed gets no MFU at all: never a guess.
PEAK_FLOPS: dict[str, dict[str, float]] = {
    "H200": {"bf16": 989e12, "fp16": 989e12},
    "H100 SXM": {"bf16": 989e12, "fp16": 989e12},
    "H100 80GB HBM3": {"bf16": 989e12, "fp16": 989e12},
    "A100": {"bf16": 312e12, "fp16": 312e12},
}


def peak_flops(device_name: str | None, precision: str) -> float | None:
    """Peak dense FLOP/s of one device at ``precision``, or None when the table does not know it."""
    if not device_name:
        return None
    for fragment, peaks in PEAK_FLOPS.items():
        if fragment in device_name:
            return peaks.get(precision)
    return None


def mfu(flops_per_sample: float | None, samples_per_s_per_device: float, peak: float | None) -> float | None:
    """Model FLOPs utilisation in [0, 1]: achieved training FLOP/s per device over the device's peak."""
    if not flops_per_sample or peak is None or samples_per_s_per_device <= 0:
        return None
    return flops_per_sample * samples_per_s_per_device / peak


def median(values: Sequence[float]) -> float | None:
    """Median, or None for an empty sequence."""
    return statistics.median(values) if values else None


class HostClock:
    """Window boundaries as host time (``perf_counter``): right where the host's work is the device's (the CPU)."""

    def mark(self) -> float:
        """A boundary now."""
        return time.perf_counter()

    def seconds(self, start: Any, end: Any) -> float:
        """Seconds from boundary ``start`` to boundary ``end``."""
        return end - start


class StepMeter:
    """Times optimizer steps in logging windows and turns a window into the perf scalars.

    A window runs from one boundary to the next, each marked by ``clock`` where the log step's work was queued
    (:meth:`boundary`): on a GPU a CUDA event in stream order (``timing.DeviceClock``), so the window holds exactly
    its steps' device work however far ahead or behind the host is when it closes the window. (Closed by host
    time, a window lost the time the host spent queueing the step after its log step and gained the next window's:
    harmless in the middle of a run, but the last window has no next step and read up to 36% fast, BENCHMARKS.md.)

    Time spent outside training steps (validation, checkpoint saves) is excluded with :meth:`paused`, and
    accounted by kind (:attr:`excluded`). On a GPU the host runs ahead of the device, so a pause first waits for
    the device (``sync``): the training work still queued counts as training time, not as the pause's. The
    first window holds start-up and compilation, so it is reported but left out of the medians.
    """

    def __init__(self, samples_per_step: int, world_size: int, tokens_per_sample: int | None,
                 flops_per_sample: float | None, peak: float | None,
                 sync: Callable[[], None] | None = None, clock: Any = None,
                 now: Callable[[], float] = time.perf_counter) -> None:
        self.samples_per_step, self.world_size = samples_per_step, world_size
        self.now = now  # the host's clock, for pauses
        self.sync = sync
        self.clock = clock if clock is not None else HostClock()
        self.excluded: dict[str, float] = {}  # seconds left out of the step times, by kind
        self.tokens_per_sample, self.flops_per_sample, self.peak = tokens_per_sample, flops_per_sample, peak
        self.history: dict[str, list[float]] = {"step_time_s": [], "tokens_per_s": [], "mfu_pct": []}
        # Wall-clock (Unix) start and end of the windows in ``history``, to set beside outside samples
        # (GPU clocks and power) of the same stretch of training.
        self.span_unix: list[float] = []
        self.first = True
        self.steps, self.wait, self.pause_s, self.start = 0, 0.0, 0.0, self.clock.mark()
        self._pause_at_boundary = 0.0

    def boundary(self) -> Any:
        """Mark the end of the window at a log step, once that step's work is queued; hand the mark to
        :meth:`close_window` later. Pauses after this mark belong to the next window."""
        self._pause_at_boundary = self.pause_s
        return self.clock.mark()

    def add_wait(self, seconds: float) -> None:
        """Count time spent waiting for data."""
        self.wait += seconds

    def step_done(self) -> None:
        """Count one optimizer step in the current window."""
        self.steps += 1

    @contextlib.contextmanager
    def paused(self, kind: str, sync: bool = True) -> Iterator[None]:
        """Leave the time spent inside this block out of the step time, and account it as ``kind``.

        With ``sync`` the device is drained on entry (queued training work is training time) and on exit (the
        block's own device work, e.g. a validation's forward passes, is the block's time). ``sync=False`` is for
        blocks that only take host time while nothing is queued.
        """
        if sync and self.sync is not None:
            self.sync()
        t0 = self.now()
        try:
            yield
        finally:
            if sync and self.sync is not None:
                self.sync()
            dt = self.now() - t0
            self.pause_s += dt
            self.excluded[kind] = self.excluded.get(kind, 0.0) + dt

    def close_window(self, steps: int | None = None, end: Any = None) -> dict[str, float]:
        """Perf scalars of the window since the last call (step time, throughput, MFU), then a new window.

        ``steps``: how many of the steps counted so far the window holds (default: all); ``end``: the window's
        boundary from :meth:`boundary` (default: now, and every pause so far is this window's). The engine closes
        a window only once the GPU has finished its last step, by which time the host has already queued the
        next one; that step is carried into the new window (its data wait, already counted, stays in this one).
        """
        steps = self.steps if steps is None else steps
        if end is None:
            end, self._pause_at_boundary = self.clock.mark(), self.pause_s
        paused = self._pause_at_boundary
        step_s = (self.clock.seconds(self.start, end) - paused) / steps
        sps = self.samples_per_step / step_s
        out = {"perf/step_time_s": step_s, "perf/data_wait_s": self.wait / steps, "perf/samples_per_s": sps}
        if self.tokens_per_sample:
            out["perf/tokens_per_s"] = sps * self.tokens_per_sample
            out["perf/tokens_per_s_per_device"] = sps * self.tokens_per_sample / self.world_size
        u = mfu(self.flops_per_sample, sps / self.world_size, self.peak)
        if u is not None:
            out["perf/mfu_pct"] = 100 * u
        wall = time.time()
        if self.first:  # left out of history: the span of the later windows starts where this one ends
            self.span_unix = [wall, wall]
        else:
            self.span_unix[1] = wall
            self.history["step_time_s"].append(step_s)
            for key in ("tokens_per_s", "mfu_pct"):
                if f"perf/{key}" in out:
                    self.history[key].append(out[f"perf/{key}"])
        self.first = False
        self.steps, self.wait, self.start = self.steps - steps, 0.0, end
        self.pause_s, self._pause_at_boundary = self.pause_s - paused, 0.0
        return out

    def medians(self) -> dict[str, float | None]:
        """Medians over every window but the first."""
        return {k: median(v) for k, v in self.history.items()}


def goodput(*, wall_s: float, startup_s: float, first_step_s: float, excluded: dict[str, float],
            samples: int, tokens_per_sample: int | None) -> dict[str, object]:
    """Throughput over the whole wall-clock of a launch, and where that time went.

    ``wall_s``: from the driver's start to the end of training; ``startup_s``: from the driver's start to the
    first step's start (processes, imports, process group, model, data); ``first_step_s``: the first step
    (compilation, warm-up); ``excluded``: checkpoint, validation and other pauses; the rest is training steps.
    ``samples``: samples trained in this launch. Shares are fractions of ``wall_s``.
    """
    parts = {"startup": startup_s, "first_step": first_step_s, **excluded}
    parts["training"] = max(0.0, wall_s - sum(parts.values()))
    rate = samples / wall_s if wall_s > 0 else None
    out: dict[str, object] = {"wall_s": wall_s, "samples_per_s": rate,
                              "shares": {k: (v / wall_s if wall_s > 0 else None) for k, v in parts.items()},
                              "seconds": parts}
    if tokens_per_sample and rate is not None:
        out["tokens_per_s"] = rate * tokens_per_sample
    return out
