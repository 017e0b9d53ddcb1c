"""A resume that tells the truth, through ``ddp_runner.cli.main()`` in this process (refusals end before any launch):
a completed run is left byte-identical and the fix (raise train.max_steps) is named; a run without a checkpoint
asks for a decision (resume=restart) instead of silently starting over; resume=last with nothing unfinished is
refused; a bad checkpoint.stop_signal is refused."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from tests.support.run_tree import run_dirs


def tree_digest(run: Path) -> dict[str, str]:
    """Every file under ``run`` and its sha256 (what "changes nothing" means)."""
    return {str(p.relative_to(run)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(run.rglob("*")) if p.is_file()}


@pytest.fixture
def completed_copy(tmp_path: Path, smoke_reference: Path) -> Path:
    """A private copy of the shared completed smoke run (8 steps), in an output root of its own."""
    run = tmp_path / "root" / "2026-01-01" / smoke_reference.name
    shutil.copytree(smoke_reference, run)
    return run


def test_resume_of_a_completed_run_is_refused_and_changes_nothing(completed_copy: Path, tmp_path: Path, cli):
    before = tree_digest(completed_copy)
    r = cli([f"resume={completed_copy}"], tmp_path / "unused")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "completed all its 8 steps" in r.stderr and f"resume={completed_copy} train.max_steps=16" in r.stderr
    assert tree_digest(completed_copy) == before, "a refused resume leaves the run byte-identical"
    r = cli([f"resume={completed_copy}", "train.max_steps=8"], tmp_path / "unused")  # not more than it ran
    assert r.returncode == 2 and tree_digest(completed_copy) == before
    assert not (tmp_path / "unused").exists()


def test_a_run_without_checkpoint_asks_for_a_decision(completed_copy: Path, tmp_path: Path, cli):
    shutil.rmtree(completed_copy / "checkpoints")
    manifest = json.loads((completed_copy / "run.json").read_text())
    (completed_copy / "run.json").write_text(json.dumps({**manifest, "status": "interrupted"}))
    before = tree_digest(completed_copy)
    r = cli([f"resume={completed_copy}"], tmp_path / "unused")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "holds no complete checkpoint" in r.stderr and "resume=restart" in r.stderr
    assert tree_digest(completed_copy) == before
    # resume=last skips it too (nothing to continue), and says what to do instead
    r = cli(["resume=last"], completed_copy.parent.parent)
    assert r.returncode == 2 and "no unfinished run with a checkpoint" in r.stderr, r.stderr
    assert run_dirs(completed_copy.parent.parent) == [completed_copy]


def test_resume_auto_names_an_unfinished_run(completed_copy: Path, cli):
    manifest = json.loads((completed_copy / "run.json").read_text())
    (completed_copy / "run.json").write_text(json.dumps({**manifest, "status": "interrupted"}))
    from ddp_runner.rundir import resume

    assert resume.unfinished_runs(str(completed_copy.parent.parent)) == [(str(completed_copy), "interrupted",
                                                                          "step_8")]
    note = resume.note_unfinished(str(completed_copy.parent.parent))
    assert note is not None and "ddp-run resume=last" in note and str(completed_copy) in note


@pytest.mark.parametrize("value, why", [("SIGUSR1", "cannot be the pre-emption signal"), ("NOPE", "no signal named"),
                                        ("9", "cannot be the pre-emption signal")])
def test_a_stop_signal_that_cannot_be_one_is_refused(value: str, why: str, out_root: Path, cli):
    r = cli(["device=cpu", f"checkpoint.stop_signal={value}"], out_root)
    assert r.returncode == 2 and "key:   checkpoint.stop_signal" in r.stderr and why in r.stderr, r.stderr
    assert not out_root.exists()
