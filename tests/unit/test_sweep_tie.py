"""A sweep whose best objective is shared (a world-size sweep at a fixed global batch gives every job the same
losses) names no best job: the record and every line that would say ``Best: job N`` say that they tie."""

from __future__ import annotations

import json
from pathlib import Path

from ddp_runner.report import sweep as sweep_mod
from ddp_runner.report.sweep import SweepRecord, best, best_line, markdown, trials_markdown

OBJ = {"key": "final_loss", "direction": "minimize"}
TIED = [{"job": 0, "values": {"world_size": "1"}, "status": "completed", "objective": 3.12345678},
        {"job": 1, "values": {"world_size": "2"}, "status": "completed", "objective": 3.12345678},
        {"job": 2, "values": {"world_size": "4"}, "status": "completed", "objective": 3.1234567800000004}]


def test_identical_objectives_tie_and_name_no_best() -> None:
    assert best(TIED, "minimize") is None
    assert [j["job"] for j in sweep_mod.top_jobs(TIED, "minimize")] == [0, 1, 2]
    line = best_line(TIED, OBJ)
    assert not line.startswith("Best: job"), line
    assert line == ("Best: none: jobs 0 (world_size=1), 1 (world_size=2), 2 (world_size=4) tie, final_loss 3.12346"
                    " (minimize).")


def test_a_tie_below_the_top_still_names_the_best() -> None:
    jobs = [*TIED, {"job": 3, "values": {"world_size": "8"}, "status": "completed", "objective": 3.0}]
    assert best(jobs, "minimize")["job"] == 3 and best_line(jobs, OBJ).startswith("Best: job 3 (world_size=8)")
    assert best(jobs, "maximize") is None  # 0, 1 and 2 tie at the top when larger is better


def test_a_distinct_best_by_less_than_a_millionth_is_a_tie() -> None:
    jobs = [{"job": 0, "objective": 1.0}, {"job": 1, "objective": 1.0 + 1e-9}]
    assert best(jobs, "minimize") is None
    assert best([{"job": 0, "objective": 1.0}, {"job": 1, "objective": 1.001}], "minimize")["job"] == 0


def test_the_sweep_files_say_they_tie(tmp_path: Path, capsys) -> None:
    rec = SweepRecord(["ddp-run", "-m", "world_size=1,2,4"], ["world_size"], None)
    rec.root, rec.objective = str(tmp_path / "out"), dict(OBJ)
    rec.jobs = [dict(j) for j in TIED]
    rec.write()
    [sweep] = list((tmp_path / "out").rglob("sweep.json"))
    record = json.loads(sweep.read_text())
    assert record["objective"]["best"] is None and record["objective"]["tied"] == [0, 1, 2]
    md = (sweep.parent / "sweep.md").read_text()
    assert "Best: job" not in md and "tie, final_loss" in md
    assert "Best: job" not in trials_markdown(record) and "tie" in trials_markdown(record)
    assert "tie, final_loss" in capsys.readouterr().out
    assert "tie, final_loss" in markdown(rec.jobs, rec.swept, rec.argv, rec.objective)
