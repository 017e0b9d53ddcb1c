"""ddp-compare shows a task's own metrics (summary.json ``metrics``: train/<name>, val/<name>) as columns."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from ddp_runner.report import compare


def _run(root: Path, name: str, metrics: dict[str, float] | None) -> Path:
    run = root / name
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"status": "completed", "task": "mytask",
                                              "plan": {"world_size": 2, "global_batch": 64, "device": "cpu"}}))
    summary = {"status": "completed", "steps": 4, "losses": [1.0, 0.5], "val_loss": 0.4,
               "median": {"step_time_s": 0.01}}
    if metrics is not None:
        summary["metrics"] = metrics
    (run / "summary.json").write_text(json.dumps(summary))
    return run


def test_a_tasks_metrics_are_columns_of_the_table_and_the_csv(tmp_path):
    runs = [compare.load_run(_run(tmp_path, "a", {"train/accuracy": 0.875, "val/accuracy": 0.9})),
            compare.load_run(_run(tmp_path, "b", None))]
    assert runs[0].metrics == {"train/accuracy": 0.875, "val/accuracy": 0.9} and runs[1].metrics == {}
    table = compare.rows(runs, None, 2.5)
    assert compare.metric_columns(table) == ["val/accuracy", "train/accuracy"]
    md = compare.markdown(table, [], 2.5)
    assert "| final loss | val loss | val/accuracy | train/accuracy |" in md
    lines = {line.split(" | ")[0]: line for line in md.splitlines() if line.startswith("| a |") or
             line.startswith("| b |")}
    assert "| 0.5 | 0.4 | 0.9 | 0.875 |" in lines["| a"] and "| 0.5 | 0.4 | — | — |" in lines["| b"]
    compare.write_csv(table, tmp_path / "report.csv")
    rows = list(csv.DictReader((tmp_path / "report.csv").open()))
    assert [r["val/accuracy"] for r in rows] == ["0.9", ""] and rows[0]["train/accuracy"] == "0.875"


def test_runs_without_metrics_keep_the_table_as_it_was(tmp_path):
    table = compare.rows([compare.load_run(_run(tmp_path, "b", None))], None, 2.5)
    assert compare.metric_columns(table) == []
    assert "| final loss | val loss | time to target |" in compare.markdown(table, [], 2.5)
