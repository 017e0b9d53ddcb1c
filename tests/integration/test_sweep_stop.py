"""A sequential sweep (``ddp-run -m``, its jobs one after another in this process) and a stop, and a grid sweep's
jobs planned before the first starts (issue 51, item 3 and polish), through ``ddp_runner.cli.main()`` in this
process with the job's execution stood in for: what the sweep does around its jobs, not the jobs themselves (the
real stop of a running job: tests/e2e/test_sweep_stop_e2e.py).
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from ddp_runner.job import execute as execute_module
from ddp_runner.job.invocation import Outcome
from ddp_runner.supervise.stop import guard
from tests.support.driver import cli_in_process

SWEEP = ["-m", "task=smoke", "device=cpu", "world_size=1", "seed=1,2,3"]


def _record(root: Path) -> dict[str, Any]:
    [found] = list(root.glob("*/*_sweep/sweep.json"))
    return json.loads(found.read_text())


def _stand_in(monkeypatch: pytest.MonkeyPatch, during: Any) -> list[list[str]]:
    """Each job's execution: ``during(num)`` (the signal it takes), then its outcome; returns the overrides of
    each job executed."""
    ran: list[list[str]] = []

    def execute(conf: dict[str, Any], how: Any, check: Any = None) -> Outcome:
        ran.append(list(how.overrides))
        return during(len(ran) - 1)

    monkeypatch.setattr(execute_module, "execute", execute)
    return ran


def _interrupted_while_running(num: int) -> Outcome:
    """As the supervisor takes a Ctrl-C while torchrun runs: the run saves and ends interrupted (128 + 2)."""
    if num == 0:
        with guard.deferred():  # the job's launch holds the stop for its supervisor
            os.kill(os.getpid(), signal.SIGINT)
        return Outcome(128 + signal.SIGINT, reason="interrupted")
    return Outcome(0)


def test_a_stop_in_a_running_job_ends_the_sweep_and_records_the_rest_not_run(tmp_path, monkeypatch):
    ran = _stand_in(monkeypatch, _interrupted_while_running)
    r = cli_in_process(SWEEP, tmp_path / "out", monkeypatch)
    assert len(ran) == 1, f"jobs started after the stop: {ran[1:]}"
    assert r.returncode == 128 + signal.SIGINT, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    jobs = _record(tmp_path / "out")["jobs"]
    assert [(j["job"], j["status"]) for j in jobs] == [(0, "not run"), (1, "not run"), (2, "not run")]
    assert jobs[1]["reason"] == jobs[2]["reason"] == "the sweep was stopped before this job started"
    assert "ddp-run: sweep: stopped by SIGINT: no further job was started" in r.stderr
    assert "not run: job 0, 1, 2" in r.stderr
    said = r.stderr.split("ddp-run: sweep: run the jobs not run with:\n", 1)[1].splitlines()
    assert [line.split(" output.root=")[0] for line in said] == [
        f"  ddp-run task=smoke device=cpu world_size=1 seed={s}" for s in (1, 2, 3)], r.stderr
    md = next((tmp_path / "out").glob("*/*_sweep/sweep.md")).read_text()
    assert md.count("| not run |") == 3, md


def test_a_stop_between_jobs_ends_the_sweep(tmp_path, monkeypatch):
    """A SIGTERM while the next job is planned (no run directory yet): no further job, the rest not run."""
    def during(num: int) -> Outcome:
        if num == 1:
            os.kill(os.getpid(), signal.SIGTERM)  # guard's handler: stopped before launching
        return Outcome(0)

    ran = _stand_in(monkeypatch, during)
    r = cli_in_process(SWEEP, tmp_path / "out", monkeypatch)
    assert len(ran) == 2 and r.returncode == 128 + signal.SIGTERM, r.stdout + r.stderr
    jobs = _record(tmp_path / "out")["jobs"]
    assert [j["status"] for j in jobs] == ["not run", "not run", "not run"]
    assert jobs[2]["reason"] == "the sweep was stopped before this job started"
    assert "stopped by SIGTERM: no further job was started" in r.stderr and "Traceback" not in r.stderr


def test_a_grid_sweep_refuses_every_infeasible_job_before_the_first_starts(tmp_path, monkeypatch):
    """A fixed global batch (32 at 8 per rank) that 3 ranks cannot share: job 2 is refused before job 0 runs."""
    from ddp_runner import cli

    seen: list[list[tuple[int, str]]] = []

    def during(num: int) -> Outcome:
        seen.append([(j["job"], j["status"]) for j in cli._run.jobs_of.record.jobs])
        return Outcome(0)

    ran = _stand_in(monkeypatch, during)
    r = cli_in_process(["-m", "experiment=fixed_global_batch", "world_size=1,2,3", "task=smoke", "device=cpu"],
                       tmp_path / "out", monkeypatch)
    assert r.returncode == 2, r.stdout + r.stderr
    assert seen[0] == [(2, "refused")], "job 2 was refused only after job 0 started"
    assert [o for o in ran[0] if o.startswith("world_size")] == ["world_size=1"] and len(ran) == 2
    assert "ddp-run: sweep: before any job starts, job 2 (world_size=3) refused: batch." in r.stderr, r.stderr
    assert r.stderr.count("refused: batch.") == 1, r.stderr
    jobs = _record(tmp_path / "out")["jobs"]
    assert [(j["job"], j["status"]) for j in jobs] == [(0, "not run"), (1, "not run"), (2, "refused")]
    assert jobs[2]["reason"].startswith("refused: batch."), jobs[2]


def test_a_stop_before_the_first_job_launched_leaves_nothing(tmp_path, monkeypatch):
    def during(num: int) -> Outcome:
        os.kill(os.getpid(), signal.SIGINT)  # while job 0 is planned
        return Outcome(0)

    ran = _stand_in(monkeypatch, during)
    r = cli_in_process(SWEEP, tmp_path / "out", monkeypatch)
    assert len(ran) == 1 and r.returncode == 128 + signal.SIGINT, r.stdout + r.stderr
    assert r.stderr.strip().splitlines()[-1] == "ddp-run: stopped by SIGINT before launching: nothing was started"
    assert not (tmp_path / "out").exists()
