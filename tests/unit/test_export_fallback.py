"""Issue 45 item 5: ``ddp-export RUN_DIR`` takes the run's newest complete checkpoint that passes its integrity check,
as a resume does: a newest ``state.pt`` cut short is passed over for the one before, with the resume's warning
(it used to refuse). A checkpoint named explicitly (``--step N``, or its path) still fails with the reason."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from ddp_runner.tasks import export as export_cli
from ddp_runner.tasks.engine.checkpoint import storage


def _state(step: int) -> dict:
    return {"model": {"w": torch.full((64,), float(step))}, "progress": {"step": step, "losses": [1.0 / step]},
            "config": "task:\n  name: smoke\n", "plan": {"world_size": 1}}


@pytest.fixture
def run(tmp_path: Path) -> Path:
    """A run directory with step_2 and step_4, step_4's state.pt truncated to half its size."""
    run = tmp_path / "run"
    for step in (2, 4):
        storage.save(str(run / "checkpoints"), step, _state(step), keep_last=0)
    state = run / "checkpoints" / "step_4" / storage.STATE_FILE
    os.truncate(state, state.stat().st_size // 2)
    return run


def test_export_of_a_run_falls_back_from_a_truncated_newest_checkpoint(run: Path, tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]):
    export_cli.main([str(run), "--out", str(tmp_path / "out")])  # was: SystemExit(2), "state.pt is … bytes"
    captured = capsys.readouterr()
    [warning] = [ln for ln in captured.err.splitlines() if "warning" in ln]
    # The resume's words (tasks/engine/checkpoint/manager.py), exporting instead of resuming.
    assert warning.startswith("ddp-export: warning: step_4 failed its integrity check (")
    assert "state.pt is" in warning and warning.endswith("); exporting from step_2")
    assert f"step 2 of {run}/checkpoints/step_2" in captured.out
    assert json.loads((tmp_path / "out" / "export.json").read_text())["step"] == 2


@pytest.mark.parametrize("named", ["--step", "path"])
def test_a_checkpoint_named_explicitly_is_refused_with_the_reason(run: Path, tmp_path: Path, named: str,
                                                                   capsys: pytest.CaptureFixture[str]):
    argv = [str(run), "--step", "4"] if named == "--step" else [str(run / "checkpoints" / "step_4")]
    with pytest.raises(SystemExit) as exc:
        export_cli.main([*argv, "--out", str(tmp_path / "out")])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "ddp-export: refused:" in err and "state.pt is" in err and "warning" not in err
    assert not (tmp_path / "out").exists()


def test_the_help_promises_the_newest_complete_checkpoint_that_passes(capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit):
        export_cli.parse(["--help"])
    assert "newest complete checkpoint that passes its integrity check" in " ".join(capsys.readouterr().out.split())
