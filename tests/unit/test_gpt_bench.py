"""The GPU sampling beside bench/gpt_bench.py's runs: nvidia-smi's CSV parsed, only training-time samples kept."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("gpt_bench", Path(__file__).parents[2] / "bench" / "gpt_bench.py")
gpt_bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpt_bench)  # type: ignore[union-attr]

# `nvidia-smi --query-gpu=GPU_QUERY --format=csv,noheader,nounits` lines (the last field: clock event reasons).
CSV = """0, 1980, 612.40, 51, 0x0000000000000000
1, 1755, 598.10, 49, 0x0000000000000004
0, 1965, 620.00, 52, 0x0000000000000004
1, [N/A], 600.00, 49, 0x0000000000000004
0, 1410, 640.80, 53, 0x0000000000000044
garbage
"""


def test_gpu_samples_give_medians_and_power_capped_share_per_gpu():
    stats = gpt_bench.parse_gpu_samples(CSV)
    assert stats["0"] == {"sm_clock_mhz": 1965.0, "power_w": 620.0, "temperature_c": 52.0, "samples": 3,
                          "power_capped_pct": 200 / 3}  # 0x4 and 0x44 have the power-cap bit, 0x0 not
    assert stats["1"]["samples"] == 1 and stats["1"]["sm_clock_mhz"] == 1755.0
    assert stats["1"]["power_capped_pct"] == 100.0
    assert gpt_bench.gpu_cell(stats) == "1965/620 cap 67% · 1755/598 cap 100%"
    assert gpt_bench.gpu_cell({}) == "—"


def test_drivers_without_the_reasons_field_still_give_clocks():
    stats = gpt_bench.parse_gpu_samples("0, 1980, 612.40, 51\n0, 1960, 600.00, 50\n")
    assert stats["0"]["sm_clock_mhz"] == 1970.0 and "power_capped_pct" not in stats["0"]
    assert gpt_bench.gpu_cell(stats) == "1970/606"


def test_only_samples_taken_while_steps_run_count():
    samples = [(10.0, "0, 990, 100, 40, 0x1"), (20.0, "0, 1700, 690, 50, 0x4"), (21.0, "0, 1600, 695, 51, 0x4"),
               (30.0, "0, 1980, 120, 45, 0x0")]  # compiling, two training samples, the exit
    stats = gpt_bench.training_gpu_stats(samples, since=15.0, until=25.0)["0"]
    assert stats["sm_clock_mhz"] == 1650.0 and stats["power_w"] == 692.5 and stats["samples"] == 2
    assert stats["power_capped_pct"] == 100.0


def test_without_nvidia_smi_nothing_is_sampled(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with gpt_bench.gpu_sampler() as samples:
        pass
    assert samples == []



def test_scaling_against_each_gpus_own_single_gpu_rate():
    rows = [
        {"who": "ddp-run", "world": 1, "tok_s": 520.0, "gpu": 0},
        {"who": "ddp-run (GPU 1 alone)", "world": 1, "tok_s": 500.0, "gpu": 1},
        {"who": "ddp-run", "world": 2, "tok_s": 990.0},
        {"who": "ddp-run x=1", "world": 2, "tok_s": 900.0},  # no single-GPU rows of its own: left out
        {"who": "reference", "world": 2, "tok_s": 800.0},
    ]
    assert gpt_bench.each_gpu_scaling(rows) == {"ddp-run": 990.0 / 1020.0}
    # A variant named with --label pairs with its own single-GPU rows.
    labelled = [{**r, "who": r["who"].replace("ddp-run", "mine")} for r in rows[:3]]
    assert gpt_bench.each_gpu_scaling(labelled) == {"mine": 990.0 / 1020.0}
    # Without GPU 1's own figure there is nothing to compare against.
    assert gpt_bench.each_gpu_scaling([rows[0], rows[2]]) == {}


def test_tokens_per_second_from_the_mean_of_the_windows():
    # Uneven windows (a clock dip in the third): the mean counts the dip's share of the time; the median hides it.
    windows = [0.064, 0.064, 0.070, 0.064, 0.064]
    assert gpt_bench.mean_window_tok_s(windows) == pytest.approx(65536 / 0.0652)
    assert gpt_bench.mean_window_tok_s(windows, tokens_per_step=1000) == pytest.approx(1000 / 0.0652)
    assert gpt_bench.mean_window_tok_s([]) is None and gpt_bench.mean_window_tok_s(None) is None


def test_table_gives_scaling_and_both_throughputs(capsys):
    gpus = {"0": {"sm_clock_mhz": 1770.0, "power_w": 692.0, "power_capped_pct": 100.0}}
    common = {"mfu_pct": 45.0, "step_s": 0.126, "first_step_s": 40.0, "wall_s": 60.0, "gpus": gpus}
    rows = [{"who": "ddp-run", "world": 1, "tok_s": 520000.0, "tok_s_mean": 518000.0, **common},
            {"who": "ddp-run", "world": 2, "tok_s": 988000.0, "tok_s_mean": 990000.0, **common},
            {"who": "reference", "world": 1, "tok_s": 488000.0, **common}]
    gpt_bench.table(rows, {"ddp-run": 520000.0, "reference": 488000.0})
    out = capsys.readouterr().out.splitlines()
    assert out[2] == ("| ddp-run | 1 | 520,000 | 518,000 | 520,000 | 45.0 | 0.1260 | 100.0% | 40.0 | 60.0 |"
                      " 1770/692 cap 100% |")
    assert out[3].startswith("| ddp-run | 2 | 988,000 | 990,000 | 494,000 | 45.0 | 0.1260 | 95.0% |")
    assert out[4].startswith("| reference | 1 | 488,000 |  | 488,000 |")  # no windows: no mean
    assert rows[1]["scaling_efficiency"] == pytest.approx(0.95)
