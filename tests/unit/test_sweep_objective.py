"""What a sweep job returns to Hydra (runner/job/objective.py) and how the sweep's record names the best trial
(runner/report/sweep.py): a number, a failed trial a search sweeper can record, or a value still pending."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from ddp_runner.job.objective import Failed, Pending, returned
from ddp_runner.launch.slurm_sweep import parse_squeue
from ddp_runner.report.sweep import SweepRecord, best, best_line, markdown, trials_markdown, value_of

SUMMARY = {"status": "completed", "val_loss": 2.5, "losses": [3.0, 2.75], "median": {"tokens_per_s": 1200.0},
           "metrics": {"accuracy": 0.75}, "final": {"perf/step_time_s": 0.25}, "goodput": {"share": 0.9}}


@pytest.mark.parametrize(("key", "value"), [("val_loss", 2.5), ("final_loss", 2.75), ("tokens_per_s", 1200.0),
                                            ("accuracy", 0.75), ("metrics.accuracy", 0.75),
                                            ("perf/step_time_s", 0.25), ("goodput.share", 0.9)])
def test_the_objective_is_read_from_summary_json(key: str, value: float) -> None:
    assert value_of(SUMMARY, key) == value


def test_a_missing_or_non_numeric_objective_is_none() -> None:
    assert value_of(SUMMARY, "nope") is None and value_of(None, "val_loss") is None
    assert value_of({"val_loss": None}, "val_loss") is None and value_of({"val_loss": math.nan}, "val_loss") is None
    assert value_of({"status": "x"}, "status") is None


def test_the_best_job_follows_the_direction_and_skips_failed_trials() -> None:
    jobs = [{"job": 0, "objective": 3.0}, {"job": 1, "objective": None}, {"job": 2, "objective": 1.0},
            {"job": 3, "objective": 1.0}]
    assert best(jobs, "minimize") is None  # 2 and 3 tie: no best (issue 51)
    assert best([*jobs, {"job": 4, "objective": 0.5}], "minimize")["job"] == 4
    assert best(jobs, "maximize")["job"] == 0
    assert best([{"job": 0, "objective": None}], "minimize") is None


def test_a_failed_trial_raises_on_float_with_its_reason_as_a_search_sweeper_expects() -> None:
    got = returned(None, "job 3: refused: train.lr=-1: must be > 0")
    assert isinstance(got, Failed)
    with pytest.raises(ValueError, match="train.lr=-1"):
        float(got)
    assert returned(0.5, "unused") == 0.5


def test_a_pending_objective_waits_once_for_its_job() -> None:
    calls = []

    def resolve() -> float:
        calls.append(1)
        return 0.25

    p = Pending(resolve)
    assert calls == [] and repr(p) == "Pending()"
    assert float(p) == 0.25 and float(p) == 0.25 and calls == [1]
    with pytest.raises(ValueError, match="failed"):
        float(Pending(lambda: Failed("job 1 failed")))


def _run_dir(tmp_path: Path, name: str, summary: dict) -> str:
    d = tmp_path / name
    d.mkdir()
    (d / "summary.json").write_text(json.dumps(summary))
    (d / "run.json").write_text(json.dumps({"status": summary.get("status"), "slurm": {"job_id": "41"}}))
    return str(d)


def test_the_record_keeps_objectives_placements_and_replaces_a_job_recorded_before(tmp_path: Path) -> None:
    rec = SweepRecord(["ddp-run", "-m"], ["train.lr"], None)
    rec.objective = {"key": "val_loss", "direction": "minimize"}
    good = _run_dir(tmp_path, "a", SUMMARY)
    bad = _run_dir(tmp_path, "b", {"status": "failed", "val_loss": 0.1})
    rec.add(0, ["train.lr=0.1"], 0, good, None, False, placement={"slurm_job": "41", "submitted": 1.0})
    rec.add(0, ["train.lr=0.1"], 0, good, None, False, placement={"cores": [0], "started": 1.0, "ended": 2.0})
    rec.add(1, ["train.lr=0.2"], 1, bad, None, False)
    rec.add(2, ["train.lr=-1"], 2, None, "refused: train.lr=-1: must be > 0", True)
    assert [j["job"] for j in rec.jobs] == [0, 1, 2], "job 0 recorded once: its second record replaced the first"
    by = {j["job"]: j for j in rec.jobs}
    assert by[0]["objective"] == 2.5 and by[0]["cores"] == [0] and "submitted" not in by[0]
    assert by[0]["slurm_job"] == "41"
    assert by[1]["objective"] is None, "a failed run's val_loss is not a trial's value"
    assert by[2]["status"] == "refused" and by[2]["objective"] is None
    jobs = sorted(rec.jobs, key=lambda j: j["job"])
    text = markdown(jobs, rec.swept, rec.argv, rec.objective)
    assert "objective (val_loss)" in text and "| 2.5 |" in text and "— (failed trial)" in text
    assert "Best: job 0 (train.lr=0.1), val_loss 2.5 (minimize)." in text
    trials = trials_markdown({"objective": rec.objective, "jobs": jobs})
    assert "## Trials: val_loss (minimize)" in trials and "Best: job 0" in trials
    assert best_line([], rec.objective).startswith("Best: none")


def test_squeue_lines_are_read_into_states() -> None:
    assert parse_squeue("12|RUNNING|n1\n13|PENDING|\n\n") == {"12": ("RUNNING", "n1"), "13": ("PENDING", "")}
