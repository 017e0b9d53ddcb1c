"""Issue 51 item 5: ``ddp-runs show`` names as the newest complete checkpoint, and as where ``continue`` resumes,
the checkpoint a resume and ``ddp-export`` would take: a newer ``step_<N>/`` whose ``meta.json`` is not a valid
commit marker, or whose ``state.pt`` is missing, is passed over (with a note), as the workers pass over it."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from ddp_runner.contract import checkpoints
from ddp_runner.report import runs
from ddp_runner.rundir import checkpoint_list


def _commit(ckpts: Path, step: int, payload: bytes = b"weights") -> Path:
    """A checkpoint folder as the workers commit it: state.pt, then a valid marker recording its size."""
    folder = ckpts / f"step_{step}"
    folder.mkdir(parents=True)
    (folder / checkpoints.STATE_FILE).write_bytes(payload)
    marker = {"format": checkpoints.FORMAT, "step": step, "bytes": len(payload),
              "sha256": hashlib.sha256(payload).hexdigest(), "state_file": checkpoints.STATE_FILE}
    (folder / checkpoints.MARKER_FILE).write_text(json.dumps(marker))
    return folder


def _not_json(folder: Path) -> None:
    (folder / checkpoints.MARKER_FILE).write_text("{not json")


def _no_state(folder: Path) -> None:
    (folder / checkpoints.STATE_FILE).unlink()


def _marker_of_another_step(folder: Path) -> None:
    marker = json.loads((folder / checkpoints.MARKER_FILE).read_text())
    (folder / checkpoints.MARKER_FILE).write_text(json.dumps({**marker, "step": 3}))


@pytest.fixture(params=[_not_json, _no_state, _marker_of_another_step])
def run(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """An interrupted run directory built by hand: a good step_4, and a newer step_6 damaged by the param."""
    run = tmp_path / "2026-01-01" / "12-00-00_smoke_w1"
    run.mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({
        "status": "interrupted", "task": "smoke", "ended": "2026-01-01T12:01:00",
        "plan": {"world_size": 1, "global_batch": 8, "per_rank_batch": 8, "accumulation": 1, "device": "cpu",
                 "backend": "gloo", "nnodes": 1, "explanation": "1 rank x 8"}}))
    _commit(run / "checkpoints", 4)
    request.param(_commit(run / "checkpoints", 6))
    return run


def test_ddp_runs_show_names_the_good_older_checkpoint(run: Path, capsys: pytest.CaptureFixture[str]):
    assert runs.main(["show", str(run)]) == 0
    text = capsys.readouterr().out
    assert "step_4 (newest complete)" in text, text
    assert f"resume={run}    # in place, from step_4" in text, text
    assert "step_6 (newest complete)" not in text and "from step_6" not in text
    assert "step_6" in text  # what was passed over is named, as a resume and ddp-export name it


def test_the_driver_lists_what_the_workers_would_load(run: Path):
    import fsspec

    fs, path = fsspec.core.url_to_fs(str(run))
    found = checkpoint_list.of_run(fs, path)
    assert found.newest == "step_4" and [name for _, name in found.complete] == ["step_4"]
