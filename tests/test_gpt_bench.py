"""The GPU sampling beside bench/gpt_bench.py's runs: nvidia-smi's CSV parsed, only training-time samples kept."""

from __future__ import annotations

import importlib.util
import os
import stat
import time
from pathlib import Path

_spec = importlib.util.spec_from_file_location("gpt_bench", Path(__file__).parents[1] / "bench" / "gpt_bench.py")
gpt_bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpt_bench)  # type: ignore[union-attr]

# `nvidia-smi --query-gpu=index,clocks.sm,power.draw,temperature.gpu --format=csv,noheader,nounits` lines.
CSV = """0, 1980, 612.40, 51
1, 1755, 598.10, 49
0, 1965, 620.00, 52
1, [N/A], 600.00, 49
0, 1410, 640.80, 53
garbage
"""


def test_gpu_samples_give_medians_per_gpu_and_skip_unparsable_lines():
    stats = gpt_bench.parse_gpu_samples(CSV)
    assert stats["0"] == {"sm_clock_mhz": 1965.0, "power_w": 620.0, "temperature_c": 52.0, "samples": 3}
    assert stats["1"]["samples"] == 1 and stats["1"]["sm_clock_mhz"] == 1755.0
    assert gpt_bench.gpu_cell(stats) == "1965/620 1755/598"
    assert gpt_bench.gpu_cell({}) == "—"


def test_only_samples_taken_while_steps_run_count():
    samples = [(10.0, "0, 990, 100, 40"), (20.0, "0, 1700, 690, 50"), (21.0, "0, 1600, 695, 51"),
               (30.0, "0, 1980, 120, 45")]  # compiling, two training samples, the exit
    stats = gpt_bench.training_gpu_stats(samples, since=15.0, until=25.0)["0"]
    assert stats["sm_clock_mhz"] == 1650.0 and stats["power_w"] == 692.5 and stats["samples"] == 2


def test_sampler_collects_lines_and_stops_its_process(tmp_path, monkeypatch):
    # A stand-in for nvidia-smi (no GPU here) that prints one sample line per call of its loop, like -lms.
    exe = tmp_path / "nvidia-smi"
    exe.write_text("#!/bin/sh\nwhile true; do echo '0, 1980, 600, 50'; sleep 0.05; done\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    with gpt_bench.gpu_sampler() as samples:
        time.sleep(1.0)
    n = len(samples)
    assert n >= 3 and all(line.startswith("0, 1980") for _, line in samples)
    time.sleep(0.3)
    assert len(samples) == n, "the sampler process is stopped when the block ends"


def test_without_nvidia_smi_nothing_is_sampled(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with gpt_bench.gpu_sampler() as samples:
        pass
    assert samples == []

