"""sweep.md's closing count (runner/report/sweep.py): only jobs that completed count as completed; a refused job (or one
that failed, was not run, was interrupted or lost) is named as not completed."""

from __future__ import annotations

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
