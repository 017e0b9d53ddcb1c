"""Issue 45 item 2, the driver's side (``ddp_runner.cli.main()`` in this process): a stray regular file
``checkpoints/step_999`` in an unfinished run is named before launch, as skipped, by ``resume=last`` (the workers
skip it too: tests/unit/test_stray_checkpoints.py) and by ``ddp-runs show``; the run's newest complete checkpoint
is still the one the driver names."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ddp_runner.report import runs


@pytest.fixture
def interrupted(tmp_path: Path, smoke_reference: Path) -> Path:
    """A private copy of the shared smoke run (step_6 and step_8 kept), interrupted, with a stray file step_999."""
    run = tmp_path / "root" / "2026-01-01" / smoke_reference.name
    shutil.copytree(smoke_reference, run)
    manifest = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**manifest, "status": "interrupted"}))
    (run / "checkpoints" / "step_999").write_text("not a checkpoint\n")
    return run


def test_resume_last_notes_the_stray_file_before_launch(interrupted: Path, cli):
    r = cli(["resume=last", "dry_run=true"], interrupted.parent.parent)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"resume=last: continuing {interrupted}" in r.stdout
    assert (f"ddp-run: note: {interrupted}: checkpoints/step_999 is not a complete checkpoint (a file, not a"
            " checkpoint folder); skipped") in r.stderr
    assert (interrupted / "checkpoints" / "step_999").read_text() == "not a checkpoint\n"


def test_ddp_runs_show_names_the_newest_complete_checkpoint_and_the_skipped_file(interrupted: Path):
    text = runs.describe(str(interrupted))
    assert "step_8 (newest complete)" in text and f"resume={interrupted}    # in place, from step_8" in text
    assert "checkpoints/step_999 is not a complete checkpoint (a file, not a checkpoint folder); skipped" in text
