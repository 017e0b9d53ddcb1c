"""ddp-compare says only what holds: runs of different tasks or throughput units are compared within their own
group (never one scaling efficiency across samples/s and tokens/s), GPU-hours and cost only for GPU runs, and every
bottleneck sentence names its run."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from ddp_runner.contract import layout
from ddp_runner.report import compare


def _write(root: Path, name: str, task: str, world: int, step_time_s: float, device: str = "cpu",
           tokens_per_sample: int | None = None, status: str = layout.STATUS_COMPLETED) -> Path:
    """A run directory as the runner leaves it: global batch 16, four logged losses."""
    run = root / name
    run.mkdir(parents=True)
    plan = {"world_size": world, "per_rank_batch": 16 // world, "accumulation": 1, "global_batch": 16,
            "device": device}
    (run / layout.MANIFEST).write_text(json.dumps({"status": status, "task": task, "plan": plan}))
    median = {"step_time_s": step_time_s,
              "tokens_per_s": 16 * tokens_per_sample / step_time_s if tokens_per_sample else None}
    (run / layout.SUMMARY).write_text(json.dumps({"status": status, "global_batch": 16, "steps": 4,
                                                  "losses": [4.0, 3.0, 2.0, 1.0], "median": median}))
    return run


def _mixed(root: Path) -> None:
    # smoke at 1 and 2 ranks (samples/s), gpt at 2 and 4 ranks (tokens/s, 64 tokens a sample)
    _write(root, "a_smoke_w1", "smoke", 1, 0.10)
    _write(root, "b_smoke_w2", "smoke", 2, 0.08)
    _write(root, "c_gpt_w2", "gpt", 2, 0.20, tokens_per_sample=64)
    _write(root, "d_gpt_w4", "gpt", 4, 0.125, tokens_per_sample=64)


def test_runs_of_two_tasks_are_compared_within_their_groups_only(tmp_path: Path) -> None:
    _mixed(tmp_path / "runs")
    runs = [compare.load_run(p) for p in compare.find_runs([str(tmp_path / "runs")])]
    assert list(compare.groups(runs)) == ["smoke (samples/s)", "gpt (tokens/s)"]
    table = {r["run"]: r for r in compare.rows(runs, None, 2.5)}
    # Each group has its own baseline: the smoke w1 run and the gpt w2 run, not the smallest run of all.
    assert table["a_smoke_w1"]["efficiency"] == 1.0 and table["c_gpt_w2"]["efficiency"] == 1.0
    assert table["b_smoke_w2"]["efficiency"] == pytest.approx((16 / 0.08 / 2) / (16 / 0.10))  # 0.625
    assert table["d_gpt_w4"]["efficiency"] == pytest.approx((16 * 64 / 0.125 / 4) / (16 * 64 / 0.20 / 2))  # 0.8
    assert {r["unit"] for r in table.values() if r["task"] == "gpt"} == {"tokens/s"}
    warns = compare.warnings(runs)
    assert warns[0].startswith("the runs fall into 2 groups that do not compare (smoke (samples/s); gpt (tokens/s))")


def test_the_report_has_a_table_per_group_and_names_every_run(tmp_path: Path) -> None:
    _mixed(tmp_path / "runs")
    out = tmp_path / "report"
    assert compare.main([str(tmp_path / "runs"), "--out", str(out)]) == 0
    report = (out / "report.md").read_text()
    smoke, gpt = report.split("## smoke (samples/s)")[1].split("## gpt (tokens/s)")
    assert "a_smoke_w1" in smoke and "c_gpt_w2" not in smoke
    assert "c_gpt_w2" in gpt.split("## Where the time goes")[0] and "a_smoke_w1" not in gpt.split("## Where")[0]
    sentences = report.split("## Where the time goes")[1].strip().splitlines()
    assert sorted(s.split(" (")[0].lstrip("- ") for s in sentences) == ["a_smoke_w1", "b_smoke_w2", "c_gpt_w2",
                                                                          "d_gpt_w4"]
    assert "- b_smoke_w2 (2 ranks): 62% scaling efficiency" in report
    # CPU runs only: no GPU-hours, no cost, no price sentence
    assert "GPU-hours" not in report.split("## Where")[0].replace("no GPU-hours", "") and "$" not in report
    rows = list(csv.DictReader((out / "report.csv").open()))
    assert {r["group"] for r in rows} == {"smoke (samples/s)", "gpt (tokens/s)"}
    assert all(r["gpu_hours"] == "" and r["cost"] == "" for r in rows)
    assert (out / "throughput.png").read_bytes()[:4] == b"\x89PNG"


def test_gpu_hours_and_cost_only_for_gpu_runs(tmp_path: Path) -> None:
    _write(tmp_path / "runs", "g_w2", "smoke", 2, 0.1, device="cuda")
    _write(tmp_path / "runs", "c_w2", "smoke", 2, 0.1, device="cpu")
    runs = [compare.load_run(p) for p in compare.find_runs([str(tmp_path / "runs")])]
    table = {r["run"]: r for r in compare.rows(runs, 2.5, 3.0)}
    gpu, cpu = table["g_w2"], table["c_w2"]
    # loss 2.5 at step 4: the median of its four logged losses (fewer than the smoothing window)
    assert gpu["time_to_target_s"] == pytest.approx(3 * 0.1) == cpu["time_to_target_s"]
    assert gpu["gpu_hours"] == pytest.approx(0.3 * 2 / 3600) and gpu["cost"] == pytest.approx(3 * gpu["gpu_hours"])
    assert cpu["gpu_hours"] is None and cpu["cost"] is None
    text = compare.markdown(compare.rows(runs, 1.0, 3.0), [], 3.0)
    assert "| GPU-hours | cost |" in text and "| — (CPU) | — |" in text and "for GPU runs only" in text


def test_a_run_with_no_measured_rate_joins_its_task_and_a_cause_without_rank_is_named(tmp_path: Path) -> None:
    _write(tmp_path / "runs", "a_w1", "smoke", 1, 0.1)
    stopped = _write(tmp_path / "runs", "b_w2", "smoke", 2, 0.1, status=layout.STATUS_INTERRUPTED)
    cause = {"rank": None, "class": "interrupted", "type": "Interrupted", "message": "interrupted by signal 2",
             "where": "the driver"}
    (stopped / layout.SUMMARY).write_text(json.dumps({"status": "interrupted", "root_cause": cause}))
    _write(tmp_path / "runs", "c_w2", "gpt", 2, 0.1, status=layout.STATUS_FAILED)
    (tmp_path / "runs" / "c_w2" / layout.SUMMARY).write_text(json.dumps({"status": "failed"}))
    runs = [compare.load_run(p) for p in compare.find_runs([str(tmp_path / "runs")])]
    assert {g: [r.name for r in m] for g, m in compare.groups(runs).items()} == {
        "smoke (samples/s)": ["a_w1", "b_w2"], "gpt (no throughput measured)": ["c_w2"]}
    table = {r["run"]: r for r in compare.rows(runs, None, 1.0)}
    assert table["b_w2"]["bottleneck"] == ("b_w2 (2 ranks): interrupted: the driver: Interrupted: interrupted by"
                                           " signal 2.")
