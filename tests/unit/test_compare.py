"""ddp-compare: the arithmetic on its own, and a report over real runs (a 1-vs-2-rank fixed-global-batch sweep
of the tiny GPT, and a run that failed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddp_runner.report import compare


def test_scaling_efficiency_is_per_rank_throughput_against_the_baseline():
    assert compare.scaling_efficiency(190.0, 2, 100.0, 1) == pytest.approx(0.95)
    assert compare.scaling_efficiency(400.0, 4, 190.0, 2) == pytest.approx(400 / 4 / (190 / 2))
    assert compare.scaling_efficiency(None, 2, 100.0, 1) is None


def test_loss_steps_follow_the_logging_interval_and_end_at_the_last_step():
    assert compare.loss_at_steps([3.0, 2.0, 1.5], 5, 12) == [(5, 3.0), (10, 2.0), (12, 1.5)]
    assert compare.loss_at_steps([3.0, 2.0], 5, 10) == [(5, 3.0), (10, 2.0)]


def test_time_to_target_gpu_hours_and_cost():
    pts = [(10, 3.0), (20, 2.5), (30, 2.0)]
    # Three logged losses, fewer than the smoothing window: their median (2.5) at the last of them, step 30.
    assert compare.time_to_target(pts, 2.5, step_time_s=0.5, first_step_s=30.0) == pytest.approx(30 + 29 * 0.5)
    assert compare.time_to_target(pts, 1.0, step_time_s=0.5) is None  # never reached
    assert compare.gpu_hours(3600.0, 2) == pytest.approx(2.0)
    assert compare.cost(2.0, 2.5) == pytest.approx(5.0)
    assert compare.cost(None, 2.5) is None


def test_config_differences_leave_out_what_a_scaling_study_changes():
    a = {"world_size": 1, "batch": {"accumulation": 2, "per_rank": 8}, "train": {"lr": 0.1}}
    b = {"world_size": 2, "batch": {"accumulation": 1, "per_rank": 8}, "train": {"lr": 0.2}, "extra": 1}
    diff = compare.config_differences({"a": a, "b": b})
    assert diff == {"train.lr": {"a": 0.1, "b": 0.2}, "extra": {"a": "<absent>", "b": 1}}


def test_bottleneck_names_data_wait_and_the_slow_gpu():
    run = compare.Run(path=Path("x"), name="x", status="completed", world=2, device="cuda", global_batch=64,
                      task="gpt", step_time_s=0.1, data_wait_s=0.02,
                      gpus={"0": {"sm_clock_mhz": 1800.0}, "1": {"sm_clock_mhz": 1700.0}})
    text = compare.bottleneck(run, 0.9)
    assert text.startswith("x (2 GPUs): 90% scaling efficiency")
    assert "20% of each step waits for data" in text and "rank 1's GPU clocks 6% below rank 0's" in text
    failed = compare.Run(path=Path("y"), name="y", status="failed", world=2, device="cpu", global_batch=16,
                         task="gpt", failure="rank 1: RuntimeError: boom")
    assert compare.bottleneck(failed, None) == "y (2 ranks): failed: rank 1: RuntimeError: boom."


def test_sweep_job_names_carry_the_swept_values():
    from ddp_runner.report import sweep

    assert sweep.job_values(["world_size=2", "train.lr=0.1", "device=cpu"], ["world_size", "train.lr"]) == {
        "world_size": "2", "train.lr": "0.1"}
    assert sweep.job_dir_name(3, "gpt", 2, {"world_size": "2", "train.lr": "0.1"}) == "3_gpt_w2_lr=0.1"
    assert sweep.job_dir_name(0, "gpt", 1, {"data.path": "/a b/c"}) == "0_gpt_w1_path=-a-b-c"


def test_a_run_whose_driver_is_gone_reads_as_lost(tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({
        "status": "running", "plan": {"world_size": 2, "global_batch": 16},
        "driver": {"host": "another-host", "pid": 1, "started": 0.0, "heartbeat": 0.0}}))
    loaded = compare.load_run(run)
    assert loaded.status == "lost"
    assert compare.bottleneck(loaded, None).startswith("r (2 ranks): lost")
