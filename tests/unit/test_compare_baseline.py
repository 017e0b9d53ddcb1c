"""ddp-compare's scaling baseline (runner/report/compare.py): the completed run with the fewest ranks, never a failed,
lost, interrupted or still running one, even when that one has fewer ranks and a measured rate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddp_runner.contract import layout
from ddp_runner.report import compare


def _run(name: str, status: str, world: int, step_time_s: float) -> compare.Run:
    """A run of global batch 16: its rate is 16 / step_time_s samples/s."""
    return compare.Run(path=Path(name), name=name, status=status, world=world, device="cpu", global_batch=16,
                       task="smoke", losses=[1.0, 0.5], steps=2, step_time_s=step_time_s)


@pytest.mark.parametrize("status", [layout.STATUS_FAILED, layout.STATUS_LOST, layout.STATUS_INTERRUPTED,
                                    layout.STATUS_RUNNING])
def test_a_run_that_did_not_complete_is_never_the_baseline(status: str) -> None:
    """A 1-rank run that did not complete, with a measured rate, is not the baseline: the completed 2-rank run is
    (efficiency 100%) and the 4-rank run is measured against it."""
    runs = [_run("w4", layout.STATUS_COMPLETED, 4, 0.04), _run("w1", status, 1, 0.1),
            _run("w2", layout.STATUS_COMPLETED, 2, 0.064)]
    assert runs[1].rate == pytest.approx(160.0)  # measured, and the fewest ranks
    table = {r["run"]: r for r in compare.rows(runs, target=None, price=1.0)}
    assert table["w2"]["efficiency"] == 1.0
    assert table["w4"]["efficiency"] == pytest.approx((16 / 0.04 / 4) / (16 / 0.064 / 2))  # 0.8
    assert table["w1"]["efficiency"] != 1.0
    assert "the baseline of the scaling efficiency" in table["w2"]["bottleneck"]
    assert table["w1"]["bottleneck"].startswith(f"w1 (1 rank): {status}")


def _write_run(root: Path, name: str, status: str, world: int, step_time_s: float) -> Path:
    run = root / name
    run.mkdir(parents=True)
    plan = {"world_size": world, "per_rank_batch": 16 // world, "accumulation": 1, "global_batch": 16,
            "device": "cpu"}
    (run / layout.MANIFEST).write_text(json.dumps({"status": status, "task": "smoke", "plan": plan}))
    (run / layout.SUMMARY).write_text(json.dumps({"status": status, "global_batch": 16, "steps": 4,
                                                  "losses": [1.0, 0.8, 0.6, 0.5],
                                                  "median": {"step_time_s": step_time_s}}))
    return run


def test_the_report_measures_scaling_against_the_smallest_completed_run(tmp_path: Path) -> None:
    """ddp-compare over a failed 1-rank run that recorded a step time, and completed 2- and 4-rank runs: the
    report's scaling efficiency is 100% for 2 ranks and 80% for 4; the failed run is not the baseline."""
    runs = tmp_path / "runs"
    _write_run(runs, "a_w1_failed", layout.STATUS_FAILED, 1, 0.1)
    _write_run(runs, "b_w2", layout.STATUS_COMPLETED, 2, 0.064)
    _write_run(runs, "c_w4", layout.STATUS_COMPLETED, 4, 0.04)
    out = tmp_path / "report"
    assert compare.main([str(runs), "--out", str(out)]) == 0
    lines = {line.split(" | ")[0].lstrip("| "): line for line in (out / "report.md").read_text().splitlines()
             if line.startswith("| ")}
    assert " | 100.0% | " in lines["b_w2"]
    assert " | 80.0% | " in lines["c_w4"]
    assert " | 100.0% | " not in lines["a_w1_failed"]
    assert "- b_w2 (2 ranks): the baseline of the scaling efficiency." in (out / "report.md").read_text()
