"""Efficiency arithmetic (``tasks.metrics``) and the GPT FLOP count it is fed with."""

from __future__ import annotations

import time

import pytest
import torch

from ddp_runner.tasks.engine.reporting import metrics
from ddp_runner.tasks.gpt.model import GPT


@pytest.mark.parametrize(("name", "precision", "peak"), [
    ("NVIDIA H200", "bf16", 989e12),
    ("NVIDIA H100 80GB HBM3", "bf16", 989e12),
    ("NVIDIA H100 80GB HBM3", "fp16", 989e12),
    ("NVIDIA A100-SXM4-80GB", "bf16", 312e12),
])
def test_peak_flops_of_known_devices(name, precision, peak):
    assert metrics.peak_flops(name, precision) == peak


@pytest.mark.parametrize(("name", "precision"), [
    ("cpu", "fp32"), ("cpu", "bf16"), (None, "bf16"), ("", "bf16"),
    ("NVIDIA GeForce RTX 4090", "bf16"),  # a device the table does not list
    ("NVIDIA H200", "fp32"),              # a known device at a dtype the table does not list
])
def test_peak_flops_unknown_is_none_never_a_guess(name, precision):
    assert metrics.peak_flops(name, precision) is None


def test_mfu_formula_and_none_when_unknown():
    # 1e9 FLOPs/sample × 100 samples/s = 1e11 FLOP/s on a 1e12 FLOP/s device: 10 %.
    assert metrics.mfu(1e9, 100.0, 1e12) == pytest.approx(0.1)
    assert metrics.mfu(1e9, 100.0, None) is None     # unknown device
    assert metrics.mfu(None, 100.0, 1e12) is None    # unknown FLOP count
    assert metrics.mfu(0.0, 100.0, 1e12) is None
    assert metrics.mfu(1e9, 0.0, 1e12) is None       # no throughput measured yet
    assert metrics.mfu(1e9, 100.0, metrics.peak_flops("cpu", "fp32")) is None


def test_median():
    assert metrics.median([]) is None
    assert metrics.median([3.0, 1.0, 2.0]) == 2.0


def test_gpt2_small_flops_per_token_is_about_855_mflop():
    with torch.device("meta"):  # no memory, no init cost: only shapes matter
        model = GPT(vocab=50257, context=1024, width=768, layers=12, heads=12)
    L, d, T, V = 12, 768, 1024, 50257
    # Parameters without position embeddings, tied head counted once: embeddings, 12 d² + 13 d per block
    # (qkv, proj, fc, out weights and biases, two LayerNorms), final LayerNorm.
    n = V * d + L * (12 * d * d + 13 * d) + 2 * d
    assert model.num_params() == n == 123_653_376
    assert model.num_params(exclude_position=False) == n + T * d
    assert model.flops_per_token() == 6 * n + 12 * L * d * T
    assert model.flops_per_token() == pytest.approx(855e6, rel=0.001)
    # The padded vocabulary of task=gpt2_small (50304) changes that by well under 0.1 %.
    with torch.device("meta"):
        padded = GPT(vocab=50304, context=1024, width=768, layers=12, heads=12)
    assert padded.flops_per_token() == pytest.approx(855e6, rel=0.001)


class _Clock:
    """The meter's clock (its ``clock`` and ``now``), moved by the test: a step or a pause takes exactly what the
    test says, however busy the machine. Durations are binary fractions, so their sums are exact."""

    def __init__(self) -> None:
        self.t = 0.0

    def mark(self) -> float:
        return self.t

    def seconds(self, start: float, end: float) -> float:
        return end - start

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds


def test_step_meter_windows_pauses_and_medians():
    from ddp_runner.tasks.engine.reporting.metrics import StepMeter

    clock = _Clock()
    meter = StepMeter(samples_per_step=64, world_size=2, tokens_per_sample=1024, flops_per_sample=1e9, peak=1e15,
                      clock=clock, now=clock.now)
    clock.sleep(0.5)  # start-up
    meter.step_done()
    first = meter.close_window()
    assert meter.medians() == {"step_time_s": None, "tokens_per_s": None, "mfu_pct": None}  # first: not counted
    meter.add_wait(0.25)
    clock.sleep(0.0625)  # a step
    meter.step_done()
    with meter.paused("checkpoint"):
        clock.sleep(0.25)
    clock.sleep(0.0625)
    meter.step_done()
    out = meter.close_window()
    assert meter.excluded["checkpoint"] == 0.25
    # 2 steps of 0.0625 s; counting the pause, 0.1875 s each
    assert out["perf/step_time_s"] == 0.0625, "time inside paused() is not a training step"
    assert out["perf/data_wait_s"] == pytest.approx(0.125)
    assert out["perf/samples_per_s"] == pytest.approx(64 / out["perf/step_time_s"])
    assert out["perf/tokens_per_s"] == pytest.approx(out["perf/samples_per_s"] * 1024)
    assert out["perf/tokens_per_s_per_device"] == pytest.approx(out["perf/tokens_per_s"] / 2)
    assert out["perf/mfu_pct"] == pytest.approx(100 * 1e9 * out["perf/samples_per_s"] / 2 / 1e15)
    assert meter.medians()["step_time_s"] == pytest.approx(out["perf/step_time_s"])
    assert set(first) == set(out)
    no_peak = StepMeter(8, 1, None, 1e9, None)
    no_peak.step_done()
    out = no_peak.close_window()
    assert "perf/mfu_pct" not in out and "perf/tokens_per_s" not in out  # unknown: left out, never guessed


def test_a_window_closed_late_carries_the_steps_queued_after_it():
    # The engine closes step k's window only after queueing step k+1 (so the GPU never drains): the window holds
    # k's steps, and k+1 starts the next one.
    from ddp_runner.tasks.engine.reporting.metrics import StepMeter

    meter = StepMeter(samples_per_step=8, world_size=1, tokens_per_sample=None, flops_per_sample=None, peak=None)
    meter.step_done()
    t0 = time.perf_counter()
    meter.close_window()  # the first window (start-up)
    for _ in range(4):
        meter.step_done()
    time.sleep(0.4)
    meter.step_done()  # queued before the window of the first four closes
    out = meter.close_window(steps=4)
    elapsed = time.perf_counter() - t0  # at least 0.4 s; more when this machine is busy
    # The time over 4 steps, not 5 (0.4 s over 5 steps would be at most 0.08 plus a fifth of any oversleep).
    assert 0.4 / 4 <= out["perf/step_time_s"] <= elapsed / 4
    assert meter.steps == 1
    meter.step_done()
    meter.close_window()
    assert meter.steps == 0
    assert len(meter.history["step_time_s"]) == 2


def test_the_span_of_the_median_windows_is_recorded_in_wall_clock_time():
    from ddp_runner.tasks.engine.reporting.metrics import StepMeter

    meter = StepMeter(samples_per_step=8, world_size=1, tokens_per_sample=None, flops_per_sample=None, peak=None)
    time.sleep(0.2)  # start-up: the first window, outside the span
    meter.step_done()
    before = time.time()
    meter.close_window()
    after = time.time()
    for _ in range(2):
        time.sleep(0.15)
        meter.step_done()
        meter.close_window()
    start, end = meter.span_unix
    assert before <= start <= after
    assert end - start >= 0.3 and end <= time.time()  # two windows of at least 0.15 s each


def test_a_pause_first_waits_for_the_training_work_still_queued():
    """On a GPU the host runs ahead: when a checkpoint or a validation pauses the meter, training steps may still
    be queued. Their device time is training time; it must not vanish into the pause (which once reported 575.6k
    tokens/s with checkpoints against 524.7k without). The device's queue is played here by a sync that takes
    0.5 s, the pause's own work by 0.25 s, on the test's clock."""
    from ddp_runner.tasks.engine.reporting.metrics import StepMeter

    clock = _Clock()
    drained = []

    def sync() -> None:  # the first call drains 0.5 s of queued training work; later ones find the queue empty
        if not drained:
            clock.sleep(0.5)
        drained.append(clock.now())

    meter = StepMeter(samples_per_step=8, world_size=1, tokens_per_sample=None, flops_per_sample=None, peak=None,
                      sync=sync, clock=clock, now=clock.now)
    clock.sleep(0.5)
    meter.step_done()
    meter.close_window()  # start-up window
    t0 = clock.now()
    meter.step_done()  # the host has queued the step; the device still works on it
    with meter.paused("checkpoint"):
        clock.sleep(0.25)
    out = meter.close_window()
    elapsed = clock.now() - t0
    assert len(drained) == 2, "the device is drained on entry and on exit"
    assert 0.5 <= out["perf/step_time_s"] <= elapsed - 0.25
    assert 0.25 <= meter.excluded["checkpoint"] < 0.5


def test_goodput_shares_add_up_and_rates_use_the_whole_wall_clock():
    from ddp_runner.tasks.engine.reporting.metrics import goodput

    g = goodput(wall_s=100.0, startup_s=10.0, first_step_s=20.0, excluded={"checkpoint": 5.0, "validation": 15.0},
                samples=6400, tokens_per_sample=1024)
    assert g["seconds"]["training"] == pytest.approx(50.0)
    assert sum(g["shares"].values()) == pytest.approx(1.0)
    assert g["shares"]["checkpoint"] == pytest.approx(0.05)
    assert g["samples_per_s"] == pytest.approx(64.0) and g["tokens_per_s"] == pytest.approx(64.0 * 1024)
    assert "tokens_per_s" not in goodput(wall_s=1.0, startup_s=0, first_step_s=0, excluded={}, samples=1,
                                         tokens_per_sample=None)


def test_startup_parts_run_from_the_driver_start_through_each_mark(monkeypatch):
    from ddp_runner.contract import layout
    from ddp_runner.tasks.engine import startup

    monkeypatch.setattr(startup, "_marks", {})
    monkeypatch.setenv(layout.ENV_T0, "100.0")
    monkeypatch.setenv(layout.ENV_LAUNCH_T, "104.5")
    for name, when in (("worker_start", 107.0), ("imports", 110.0), ("process_group", 110.5), ("ready", 115.0),
                       ("loop_start", 115.25)):
        startup.mark(name, when)
    assert startup.parts() == {"driver": 4.5, "agent": 2.5, "imports": 3.0, "process_group": 0.5, "build": 4.5,
                               "loop_setup": 0.25}
    # A worker started by hand (no driver): the parts it can time, nothing invented for the rest.
    monkeypatch.delenv(layout.ENV_T0)
    monkeypatch.delenv(layout.ENV_LAUNCH_T)
    assert startup.parts() == {"imports": 3.0, "process_group": 0.5, "build": 4.5, "loop_setup": 0.25}
