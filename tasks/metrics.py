"""Efficiency arithmetic: throughput, MFU against a device's stated peak. Pure functions."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

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


def scaling_efficiency(tokens_per_s_1: float, tokens_per_s_n: float, n: int) -> float:
    """Throughput on n devices over n × throughput on one."""
    return tokens_per_s_n / (n * tokens_per_s_1)
