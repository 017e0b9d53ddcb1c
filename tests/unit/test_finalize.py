"""The driver's closing lines about each rank's GPU (runner/launch/finalize.py), from summary.json's ``gpus``."""

from __future__ import annotations

from runner.launch.finalize import gpu_lines


def _gpu(clock: float, capped: float = 100.0, thermal: float = 0.0) -> dict[str, float]:
    return {"sm_clock_mhz": clock, "power_w": 691.4, "temperature_c": 54.5, "power_capped_pct": capped,
            "thermal_slowdown_pct": thermal}


def test_no_telemetry_no_lines():
    assert gpu_lines({}) == []


def test_each_rank_in_rank_order_with_its_power_limit():
    [line] = gpu_lines({"1": _gpu(1740.0), "0": _gpu(1770.0, capped=0.0)})
    assert line == ("ddp-run: GPUs while training (medians): rank 0 1770 MHz 691 W 54 °C · "
                    "rank 1 1740 MHz 691 W 54 °C at its power limit")


def test_a_gpu_clocked_well_below_the_others_is_named():
    # Call B's 2-GPU run (BENCHMARKS.md): 1785 against 1680 MHz, 5.9% apart.
    lines = gpu_lines({"0": _gpu(1785.0), "1": _gpu(1680.0, thermal=12.0)})
    assert "thermal slowdown 12% of the time" in lines[0]
    assert lines[1].startswith("ddp-run: note: rank 1's GPU ran 6% below rank 0's (1680 against 1785 MHz)")
    # Within 3% of each other (call A: 1770 and 1748 MHz): no note.
    assert len(gpu_lines({"0": _gpu(1770.0), "1": _gpu(1748.0)})) == 1
    assert len(gpu_lines({"0": _gpu(1770.0)})) == 1
