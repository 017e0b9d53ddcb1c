"""A stop signal to the driver before torchrun runs (issue 45, item 6), through ``ddp_runner.cli.main()`` in this
process: wherever it lands, the console says one line (never a traceback), the exit code is 128 + the signal, and no
run directory is left without its records.

The signal is this process's own SIGINT, sent from inside the driver's step it must land in (planning, the run
directory just made, the launch just recorded): Python runs the handler at the next bytecode, so it lands there on
any machine.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ddp_runner.job import execute, launching
from ddp_runner.rundir import run_dir
from tests.support.driver import cli_in_process
from tests.support.run_tree import load_json, run_dirs

SMOKE = ["task=smoke", "device=cpu", "world_size=1", "train.max_steps=2"]


def _then_sigint(real: Callable[..., Any]) -> Callable[..., Any]:
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        out = real(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGINT)
        return out

    return wrapped


def _stop_after(where: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if where == "planning":
        monkeypatch.setattr(execute, "plan_job", _then_sigint(execute.plan_job))
    elif where == "the run directory made":
        monkeypatch.setattr(run_dir, "create_run_dir", _then_sigint(run_dir.create_run_dir))
    else:  # config.yaml and run.json written, torchrun not started yet
        monkeypatch.setattr(launching, "_record_start", _then_sigint(launching._record_start))


@pytest.mark.parametrize("where", ["planning", "the run directory made", "the launch recorded"])
def test_a_stop_before_torchrun_runs_is_one_line_and_leaves_no_run_without_records(where, tmp_path, monkeypatch):
    root = tmp_path / "out"
    _stop_after(where, monkeypatch)
    before = signal.getsignal(signal.SIGINT)
    try:
        r = cli_in_process(SMOKE, root, monkeypatch)
    except KeyboardInterrupt:
        pytest.fail(f"a stop after {where} escaped as a raw KeyboardInterrupt")
    assert signal.getsignal(signal.SIGINT) is before, "the driver put this process's handler back"
    assert r.returncode == 128 + signal.SIGINT, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    said = [line for line in r.stderr.splitlines() if "SIGINT" in line]
    assert len(said) == 1 and said[0].startswith("ddp-run: stopped by SIGINT before"), r.stderr
    runs = run_dirs(root)
    if where != "the launch recorded":  # nothing ran: nothing is left
        assert "nothing was started" in said[0] and not runs
        assert not [p for p in root.rglob("*") if p.is_file()], "nothing of a run is left"
        return
    # The launch was recorded: the run directory stays, its records whole, torchrun never started.
    [run] = runs
    assert said[0] == "ddp-run: stopped by SIGINT before torchrun started", r.stderr
    manifest, summary = load_json(run / "run.json"), load_json(run / "summary.json")
    assert manifest["status"] == summary["status"] == "interrupted" and Path(run / "config.yaml").exists()
