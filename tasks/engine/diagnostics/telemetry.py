"""Each rank's GPU clock, power, temperature and power-cap state, sampled in the background through NVML.

A GPU held at its power limit lowers its SM clock, so on such a GPU throughput follows the chip and its
temperature as well as the code; and with DDP every rank waits for the slowest GPU at every step. The engine logs
these figures beside the throughput (TensorBoard ``gpu<R>/...`` and ``summary.json``'s ``gpus``), so a slow run
or a poor scaling figure can be told apart from a slow GPU.

NVML is read through ``pynvml`` (the ``nvidia-ml-py`` package). Where it is missing or cannot start (a CPU run,
a host without the NVIDIA driver), nothing is sampled and nothing is logged.
"""

from __future__ import annotations

import statistics
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

# NVML's clock event ("throttle") reason bits (nvml.h, nvmlClocksEventReason*).
SW_POWER_CAP = 0x4
HW_SLOWDOWN = 0x8
SW_THERMAL = 0x20
HW_THERMAL = 0x40
HW_POWER_BRAKE = 0x80
POWER_BITS = SW_POWER_CAP | HW_POWER_BRAKE
THERMAL_BITS = SW_THERMAL | HW_THERMAL | HW_SLOWDOWN

# What one window reports, in this order (also the order of the values gathered from every rank).
FIELDS = ("sm_clock_mhz", "power_w", "temperature_c", "power_capped_pct", "thermal_slowdown_pct")


@dataclass(frozen=True)
class Sample:
    """One reading of one GPU."""

    sm_clock_mhz: float
    power_w: float
    temperature_c: float
    reasons: int  # NVML clock event reason bits


def summarize(samples: Iterable[Sample]) -> dict[str, float] | None:
    """Means over a window's samples, and the share of samples (in %) held down by the power cap or by heat.

    None for an empty window (no sample yet: a window shorter than the sampling interval).
    """
    samples = list(samples)
    if not samples:
        return None
    n = len(samples)
    return {
        "sm_clock_mhz": statistics.fmean(s.sm_clock_mhz for s in samples),
        "power_w": statistics.fmean(s.power_w for s in samples),
        "temperature_c": statistics.fmean(s.temperature_c for s in samples),
        "power_capped_pct": 100.0 * sum(bool(s.reasons & POWER_BITS) for s in samples) / n,
        "thermal_slowdown_pct": 100.0 * sum(bool(s.reasons & THERMAL_BITS) for s in samples) / n,
    }


def medians(windows: Iterable[Mapping[str, float]]) -> dict[str, float]:
    """Per-field medians over a run's windows (the form ``summary.json`` keeps per rank)."""
    windows = list(windows)
    return {k: statistics.median(w[k] for w in windows) for k in FIELDS} if windows else {}


class Sampler:
    """Reads this rank's GPU every ``interval_s`` on a daemon thread; :meth:`window` summarizes what came since.

    ``Sampler.start(device)`` returns None on a CPU device or where NVML is not available.
    """

    def __init__(self, handle: Any, nvml: Any, interval_s: float) -> None:
        self._handle, self._nvml, self._interval = handle, nvml, interval_s
        # Renamed from "throttle reasons" in newer NVML; older pynvml has only the old name.
        self._reasons = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) \
            or nvml.nvmlDeviceGetCurrentClocksThrottleReasons
        # One reading before the thread starts: an unsupported query fails here, not silently on the thread.
        self._last = self._read()
        self._samples: list[Sample] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpu-telemetry", daemon=True)
        self._thread.start()

    @classmethod
    def start(cls, device: torch.device, interval_s: float = 0.2) -> Sampler | None:
        """A running sampler for ``device``'s GPU, or None (CPU device, no pynvml, NVML fails to start)."""
        if device.type != "cuda":
            return None
        try:
            import pynvml

            pynvml.nvmlInit()
            # By UUID: the CUDA index is relative to CUDA_VISIBLE_DEVICES, NVML's is not.
            uuid = str(torch.cuda.get_device_properties(device).uuid)
            handle = pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
            return cls(handle, pynvml, interval_s)
        except Exception:  # noqa: BLE001 - any NVML or import failure just means no telemetry
            return None

    def _read(self) -> Sample:
        nv, h = self._nvml, self._handle
        return Sample(
            sm_clock_mhz=float(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
            power_w=nv.nvmlDeviceGetPowerUsage(h) / 1000.0,
            temperature_c=float(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)),
            reasons=int(self._reasons(h)),
        )

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                sample = self._read()
            except Exception:  # noqa: BLE001 - a failed reading is skipped, not fatal to training
                continue
            with self._lock:
                self._samples.append(sample)
                self._last = sample

    def window(self) -> dict[str, float]:
        """:func:`summarize` of the samples since the last call; the latest reading when none came since (a
        window shorter than the sampling interval)."""
        with self._lock:
            samples, self._samples = self._samples or [self._last], []
        return summarize(samples)  # type: ignore[return-value]  # never empty

    def close(self) -> None:
        """Stop the sampling thread."""
        self._stop.set()
        self._thread.join(timeout=5)
