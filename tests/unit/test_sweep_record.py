"""sweep.md's closing count (runner/report/sweep.py): only jobs that completed count as completed; a refused job (or one
that failed, was not run, was interrupted or lost) is named as not completed."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ddp_runner.report import sweep


def _job(num: int, status: str) -> dict[str, Any]:
    job: dict[str, Any] = {"job": num, "values": {"world_size": str(num + 1)}, "status": status}
    if status in ("refused", "not run"):
        job["reason"] = "world_size=2: more processes than visible GPUs"
    else:
        job["run_dir"] = f"outputs/2026-01-01/12-00-00_sweep/{num}_smoke_w{num + 1}"
        job["figures"] = {"global_batch": 16, "samples_per_s": 100.0, "final_loss": 0.5}
    return job


@pytest.mark.parametrize("status", ["refused", "failed", "not run", "interrupted", "lost"])
def test_the_closing_count_leaves_out_a_job_that_did_not_complete(status: str) -> None:
    """4 jobs, job 1 not completed (refused, …): sweep.md says 3 of 4 completed and names job 1."""
    jobs = [_job(0, "completed"), _job(1, status), _job(2, "completed"), _job(3, "completed")]
    text = sweep.markdown(jobs, ["world_size"], ["ddp-run", "-m", "world_size=1,2,3,4"])
    assert "4 of 4 jobs completed" not in text
    assert "3 of 4 jobs completed. Not completed: 1." in text.splitlines()
    assert f"| 1 | 2 | {status} |" in text  # the job keeps its row, with its own status


def test_a_sweep_of_refusals_only_completed_none() -> None:
    """Every job refused: 0 of N completed, every job named."""
    text = sweep.markdown([_job(0, "refused"), _job(1, "refused")], ["world_size"], ["ddp-run", "-m"])
    assert "0 of 2 jobs completed. Not completed: 0, 1." in text.splitlines()


# -- issue 43, item 4: a sweep ends with one table of its jobs, fitted to the terminal -------------------------------

def _finished(num: int, lr: str, status: str = "completed") -> dict[str, Any]:
    job = _job(num, status)
    job["values"] = {"world_size": str(num % 2 + 1), "train.lr": lr}
    job["figures"] = {"steps": 24, "final_loss": 1.0 / (num + 1), "val_loss": 0.5 / (num + 1),
                      "samples_per_s": 1234.5, "global_batch": 16}
    job["objective"] = 0.5 / (num + 1) if status == "completed" else None
    return job


@pytest.mark.parametrize("width", [60, 80, 100, 120, None])
def test_the_sweeps_table_fits_the_terminal(width: int | None) -> None:
    from ddp_runner.report import sweep_table

    jobs = [_finished(1, "0.05"), _finished(0, "0.01"), _finished(2, "0.1", "failed")]
    lines = sweep_table.table(jobs, ["world_size", "train.lr"], {"key": "val_loss"}, width)
    head, *rows = (line.split() for line in lines)
    assert head[:4] == ["job", "world_size", "train.lr", "status"] and len(rows) == 3
    assert [r[:4] for r in rows] == [["0", "1", "0.01", "completed"], ["1", "2", "0.05", "completed"],
                                     ["2", "1", "0.1", "failed"]]
    assert width is None or all(len(line) <= width for line in lines)
    if width is None or width >= 100:  # every column (narrower: the throughput goes first)
        assert rows[0][4:] == ["24", "1.0000", "0.5000", "1,234", "samples/s"]


def test_a_sweep_prints_its_table_once_at_its_end(tmp_path, capsys) -> None:
    """The record's closing lines: the count, one row per job, the best job."""
    record = sweep.SweepRecord(["ddp-run", "-m", "train.lr=0.01,0.05"], ["train.lr"], None)
    record.root = str(tmp_path)
    for num, lr in ((0, "0.01"), (1, "0.05")):
        run = tmp_path / f"run{num}"
        run.mkdir()
        (run / "summary.json").write_text(json.dumps({"status": "completed", "steps": 24, "val_loss": 0.5 + num,
                                                      "losses": [1.0, 0.9 + num]}))
        record.add(num, [f"train.lr={lr}"], 0, str(run), None, False)
    record.write()
    out = capsys.readouterr().out.splitlines()
    assert out[-5].startswith("ddp-run: sweep: 2 of 2 jobs completed; ")
    assert out[-4].split()[:3] == ["job", "train.lr", "status"]
    assert out[-3].split()[:3] == ["0", "0.01", "completed"] and out[-2].split()[:3] == ["1", "0.05", "completed"]
    assert out[-1] == "ddp-run: sweep: Best: job 0 (train.lr=0.01), val_loss 0.5 (minimize)."
