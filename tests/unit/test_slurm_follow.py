"""A Slurm sweep's jobs followed together (runner/launch/slurm_sweep.py), with Slurm's answers stood in for: one
question for all jobs per poll, a line (or the table's row) per change, each job finished as it ends."""

from __future__ import annotations

import io
from typing import Any

import pytest

from ddp_runner.launch import slurm_sweep


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def slurm(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Slurm's states, poll by poll; which jobs were asked about; which were finished."""
    fake: dict[str, Any] = {"polls": [], "asked": [], "finished": []}

    def states(ids):
        fake["asked"].append(sorted(ids))
        return fake["polls"].pop(0)

    def await_final(rd, state):
        fake["finished"].append((rd, state))
        return {"status": "completed" if state == "COMPLETED" else "failed"}

    monkeypatch.setattr(slurm_sweep, "states", states)
    monkeypatch.setattr(slurm_sweep, "await_final", await_final)
    monkeypatch.setattr(slurm_sweep, "POLL_S", 0.0)
    return fake


@pytest.mark.parametrize("stream", [io.StringIO, Terminal])
def test_every_job_is_asked_about_at_once_and_finished_as_it_ends(slurm: dict[str, Any], stream: type,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TERM", "xterm")
    slurm["polls"] = [{"1": ("RUNNING", "n1"), "2": ("PENDING", "")},
                      {"1": ("COMPLETED", "n1"), "2": ("RUNNING", "n2")},
                      {"2": ("FAILED", "n2")}]
    ended = []
    out = stream()
    f = slurm_sweep.Follower(on_end=ended.append, stream=out)
    f.add(0, {"seed": "1"}, "rd0", "1", 100.0)
    f.add(1, {"seed": "2"}, "rd1", "2", 100.5)
    f.wait(0)
    assert [e.num for e in ended] == [0] and ended[0].code == 0
    f.wait_all()
    assert [(e.num, e.code, e.state) for e in ended] == [(0, 0, "COMPLETED"), (1, 1, "FAILED")]
    assert slurm["asked"] == [["1", "2"], ["1", "2"], ["2"]], "one question per poll, for the jobs still pending"
    assert slurm["finished"] == [("rd0", "COMPLETED"), ("rd1", "FAILED")]
    text = out.getvalue()
    assert "job 0 (Slurm job 1) RUNNING on n1" in text and "job 1 (Slurm job 2) FAILED" in text


def test_a_job_slurm_forgot_is_finished_from_its_run_directory(slurm: dict[str, Any]) -> None:
    slurm["polls"] = [{}]
    ended = []
    f = slurm_sweep.Follower(on_end=ended.append, stream=io.StringIO())
    f.add(0, {}, "rd0", "7", 1.0)
    f.wait_all()
    assert slurm["finished"] == [("rd0", "unknown")] and ended[0].code == 1
