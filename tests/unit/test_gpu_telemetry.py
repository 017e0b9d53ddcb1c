"""GPU telemetry (tasks/gpu_telemetry.py): window means, power-cap and thermal shares, the sampler's thread.

NVML itself needs an NVIDIA driver, so here the real ``pynvml`` can only fail to start (no driver on this host)
and a stand-in with NVML's call names feeds the sampler. The real readings are checked on the GPU host
(BENCHMARKS.md).
"""

from __future__ import annotations

import threading

import pytest
import torch

from ddp_runner.tasks.engine.diagnostics import telemetry as gt
from ddp_runner.tasks.engine.diagnostics.telemetry import Sample
from tests.support.waiting import wait_for


def test_window_means_and_shares():
    s = [Sample(1800, 690.0, 55, gt.SW_POWER_CAP), Sample(1700, 700.0, 57, gt.SW_POWER_CAP | gt.SW_THERMAL),
         Sample(1980, 120.0, 40, 0x1), Sample(1500, 650.0, 80, gt.HW_THERMAL)]
    w = gt.summarize(s)
    assert w == pytest.approx({"sm_clock_mhz": 1745.0, "power_w": 540.0, "temperature_c": 58.0,
                               "power_capped_pct": 50.0, "thermal_slowdown_pct": 50.0})
    assert list(w) == list(gt.FIELDS)
    assert gt.summarize([]) is None
    # The hardware power brake counts as power-capped; idle (0x1) and application clocks (0x2) do not.
    assert gt.summarize([Sample(1, 1, 1, gt.HW_POWER_BRAKE), Sample(1, 1, 1, 0x3)])["power_capped_pct"] == 50.0


def test_medians_over_windows():
    ws = [dict.fromkeys(gt.FIELDS, v) for v in (3.0, 1.0, 2.0, 10.0)]
    assert gt.medians(ws) == dict.fromkeys(gt.FIELDS, 2.5)
    assert gt.medians([]) == {}


def test_no_telemetry_on_cpu_or_without_a_driver():
    assert gt.Sampler.start(torch.device("cpu")) is None
    # The real pynvml, on a host without the NVIDIA driver: NVML cannot start, so no sampler and no error.
    assert gt.Sampler.start(torch.device("cuda", 0)) is None


class _FakeNVML:
    """NVML's call names, answering from a list of readings (the old "throttle reasons" name only)."""

    NVML_CLOCK_SM, NVML_TEMPERATURE_GPU = 1, 0

    def __init__(self, readings: list[tuple[int, int, int, int]]) -> None:
        self.readings, self.i, self.lock = readings, 0, threading.Lock()

    def _now(self) -> tuple[int, int, int, int]:
        return self.readings[min(self.i, len(self.readings) - 1)]

    def nvmlDeviceGetClockInfo(self, h, kind):  # noqa: N802 - NVML's names
        assert kind == self.NVML_CLOCK_SM
        return self._now()[0]

    def nvmlDeviceGetPowerUsage(self, h):  # noqa: N802
        return self._now()[1]  # milliwatts

    def nvmlDeviceGetTemperature(self, h, sensor):  # noqa: N802
        return self._now()[2]

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h):  # noqa: N802
        with self.lock:
            r = self._now()[3]
            self.i += 1  # the last call of a reading moves on to the next
        return r


def test_sampler_windows_take_what_came_since_the_last_one():
    nv = _FakeNVML([(1800, 690_000, 55, gt.SW_POWER_CAP), (1700, 700_000, 57, 0)] + [(1900, 300_000, 50, 0)] * 1000)
    s = gt.Sampler(handle=object(), nvml=nv, interval_s=0.001)
    try:
        wait_for("two readings", lambda: nv.i >= 2, timeout=5, interval=0.005)
        first = s.window()
        assert first is not None and first["power_w"] > 300.0  # watts, from milliwatts
        wait_for("ten readings", lambda: nv.i >= 10, timeout=5, interval=0.005)
        second = s.window()
        assert second == {"sm_clock_mhz": 1900.0, "power_w": 300.0, "temperature_c": 50.0,
                          "power_capped_pct": 0.0, "thermal_slowdown_pct": 0.0}
    finally:
        s.close()
    assert not s._thread.is_alive()
    # Nothing new since the last window (a log step sooner than the sampling interval): the latest reading.
    assert s.window() == second


def test_a_query_the_gpu_does_not_answer_means_no_sampler_and_no_thread():
    class NoReasons(_FakeNVML):
        def nvmlDeviceGetCurrentClocksThrottleReasons(self, h):  # noqa: N802
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")

    before = threading.active_count()
    with pytest.raises(RuntimeError, match="NOT_SUPPORTED"):
        gt.Sampler(handle=object(), nvml=NoReasons([(1, 1, 1, 0)]), interval_s=0.001)
    assert threading.active_count() == before
