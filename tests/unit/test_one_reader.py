"""Issue 50 item 4: a run's records are read one way. Every reader of run.json and summary.json goes through
runner/rundir/records.py (one failure: DamagedFile, naming the file), and ddp-runs and ddp-compare take a run's
figures from one rule (runner/rundir/figures.py), so the two commands never show one run two ways."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddp_runner.contract import layout
from ddp_runner.report import compare, projection_inputs, sweep
from ddp_runner.rundir import listing, records, run_dir

PLAN = {"world_size": 2, "per_rank_batch": 4, "accumulation": 1, "global_batch": 8, "device": "cpu",
        "backend": "gloo", "nnodes": 1, "explanation": "8 = 4 × 2 × 1"}


def _run(tmp_path: Path, summary: dict) -> Path:
    run = tmp_path / "2026-01-01" / "12-00-00_gpt_w2"
    run.mkdir(parents=True)
    (run / layout.MANIFEST).write_text(json.dumps({"status": "completed", "task": "gpt", "plan": PLAN}))
    (run / layout.SUMMARY).write_text(json.dumps(summary))
    return run


@pytest.mark.parametrize("summary", [
    # tokens: tokens/s of a run is its samples/s at the median step time times the tokens per sample it counted
    {"status": "completed", "steps": 6, "losses": [3.0, 2.0, float("nan")], "final": {"train/loss": 9.0},
     "median": {"step_time_s": 0.25, "tokens_per_s": 4100.0}},
    # no logged loss: the final train/loss; no median step time: the final one
    {"status": "completed", "steps": 4, "losses": [], "final": {"train/loss": 1.5, "perf/step_time_s": 0.5},
     "median": {}},
])
def test_ddp_runs_and_ddp_compare_show_one_run_the_same(tmp_path: Path, summary: dict):
    run = _run(tmp_path, summary)
    row = listing.scan(str(tmp_path)).rows[0]
    seen = compare.load_run(run)
    assert (row.step, row.last_loss, row.unit) == (seen.steps, seen.last_loss, seen.unit)
    assert row.throughput == pytest.approx(seen.rate)
    table = compare.rows([seen], None, 1.0)[0]
    assert table["final_loss"] == row.last_loss and table["rate"] == pytest.approx(row.throughput)


def test_a_damaged_record_fails_one_way_in_every_reader(tmp_path: Path):
    run = _run(tmp_path, {"status": "completed"})
    (run / layout.MANIFEST).write_text("{not json")
    rd = run_dir.open_run_dir(str(run))
    with pytest.raises(records.DamagedFile, match="not valid JSON"):
        rd.read_json(layout.MANIFEST)  # the launchers' reader
    with pytest.raises(records.DamagedFile, match="not valid JSON"):
        compare.load_run(run)
    (name, why), = listing.scan(str(tmp_path)).skipped
    assert name == f"2026-01-01/{run.name}" and why.startswith("run.json: not valid JSON, truncated or corrupted")
    # Readers that go without a damaged record get nothing, never a traceback.
    assert sweep.read_json(str(run), layout.MANIFEST) is None
    with pytest.raises(ValueError, match=r"not JSON \("):
        projection_inputs.links_file(run / layout.MANIFEST)
    (run / layout.MANIFEST).unlink()
    with pytest.raises(records.DamagedFile, match="is missing"):
        rd.read_json(layout.MANIFEST)
