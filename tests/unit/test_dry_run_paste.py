"""A dry run's torchrun line pasted by hand (issue 43): it needs its run directory. Named nowhere (RUN_DIR unset),
torchrun's agent refuses in one line before any rank starts, and a worker started on its own does too (both used to
end every rank with ``KeyError: 'DDP_RUNNER_RUN_DIR'``). The line itself: runner/job/dry_run.py."""

from __future__ import annotations

import sys

import pytest

from ddp_runner.contract import layout
from ddp_runner.job import dry_run
from ddp_runner.launch import agent
from ddp_runner.tasks import worker

TORCHRUN = ["--nnodes=1", "--nproc-per-node=2", "--no-python", sys.executable, "-P", "-u", "-m", "ddp_runner.tasks"]


def test_the_agent_refuses_a_worker_with_no_run_directory() -> None:
    why = agent.missing_run_dir([*TORCHRUN, ""], {})
    assert why is not None and why.startswith("no run directory") and "set RUN_DIR" in why
    assert agent.missing_run_dir([*TORCHRUN, ""], {layout.ENV_RUN_DIR: "/runs/x"}) is None
    assert agent.missing_run_dir([*TORCHRUN, "/runs/x"], {}) is None
    assert agent.missing_run_dir(["--nproc-per-node=2", "train.py"], {}) is None  # another command: torchrun's own


def test_a_worker_on_its_own_with_no_run_directory_is_refused_in_one_line(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv(layout.ENV_RUN_DIR, raising=False)
    assert worker.main(None) == layout.EXIT_REFUSED
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("ddp_runner.tasks: refused: no run directory") and layout.ENV_RUN_DIR in line


def test_the_line_checks_the_first_run_dir_only() -> None:
    line = dry_run.shell_line(["torchrun", "$RUN_DIR"], {layout.ENV_RUN_DIR: "$RUN_DIR", "OMP_NUM_THREADS": "1"})
    assert line == (f'env "{layout.ENV_RUN_DIR}={dry_run.RUN_DIR_CHECK}" OMP_NUM_THREADS=1 torchrun "$RUN_DIR"')
    assert dry_run.shell_line(["a b"], {}) == "'a b'"
