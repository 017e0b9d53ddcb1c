"""Issue 45 item 2: what sits in a checkpoints folder but is not a complete checkpoint (a stray regular file named
``step_999``, a ``step_<N>/`` whose save never committed) is skipped by every reader of the folder, with a note:
the workers' storage (their resume and keep_last), ``ddp-export``, and the driver before launch. A stray file used
to make the workers' listing raise NotADirectoryError (rank 0 died on resume=last, the run turned failed) and
``ddp-export`` refuse with Errno 20."""

from __future__ import annotations

import uuid
from pathlib import Path

import fsspec
import pytest
import torch

from ddp_runner.contract import checkpoints as rules
from ddp_runner.rundir import checkpoint_list
from ddp_runner.rundir import resume as driver_resume
from ddp_runner.tasks import export as export_cli
from ddp_runner.tasks.engine.checkpoint import storage
from ddp_runner.tasks.engine.checkpoint.manager import resume_sources


def _state(step: int) -> dict:
    return {"model": {"w": torch.full((4,), float(step))}, "progress": {"step": step, "losses": [1.0 / step]},
            "config": "task:\n  name: smoke\n", "plan": {"world_size": 1}}


@pytest.fixture(params=["local", "memory"])
def run(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A run directory whose checkpoints folder holds step_2 and step_4, a stray file ``step_999`` and a
    ``step_7/`` that never committed (no meta.json)."""
    url = str(tmp_path / "run") if request.param == "local" else f"memory://stray-{uuid.uuid4().hex[:12]}/run"
    root = f"{url}/checkpoints"
    for step in (2, 4):
        storage.save(root, step, _state(step), keep_last=0)
    fs, path = fsspec.core.url_to_fs(root)
    fs.pipe_file(f"{path}/step_999", b"not a checkpoint\n")
    fs.makedirs(f"{path}/step_7", exist_ok=True)
    fs.pipe_file(f"{path}/step_7/state.pt", b"half a save")
    return url


def test_the_contract_names_what_is_not_a_complete_checkpoint():
    marker = {"format": rules.FORMAT, "step": 3, "bytes": 1, "sha256": "x", "state_file": rules.STATE_FILE}
    assert rules.entry_problem("step_3", True, True) is None and rules.marker_problem("step_3", marker) is None
    assert rules.entry_problem("step_3.tmp-ab12", False, False) is None  # a save's sibling: not a reader's business
    assert rules.entry_problem("step_999", False, False) == "a file, not a checkpoint folder"
    assert rules.entry_problem("step_7", True, False) == "no meta.json: a save that never committed"
    assert rules.marker_problem("step_3", "{oops") == "its meta.json is not a valid commit marker"
    assert rules.marker_problem("step_4", marker) is not None  # another step's marker commits nothing here
    assert rules.skipped_note("step_999", "a file, not a checkpoint folder") == (
        "checkpoints/step_999 is not a complete checkpoint (a file, not a checkpoint folder); skipped")


def test_the_workers_storage_skips_a_stray_file_and_never_deletes_it(run: str):
    root = f"{run}/checkpoints"
    assert [s for s, _ in storage.list_complete(root)] == [2, 4]  # was: NotADirectoryError
    assert storage.list_skipped(root) == [("step_7", "no meta.json: a save that never committed"),
                                          ("step_999", "a file, not a checkpoint folder")]
    assert not storage.is_checkpoint(f"{root}/step_999")
    # The resume's sources (rank 0 and every other rank): the newest complete first, the stray nowhere.
    assert [u.rsplit("/", 1)[-1] for u in resume_sources("auto", root).urls] == ["step_4", "step_2"]
    assert [u.rsplit("/", 1)[-1] for u in resume_sources(run, f"{run}/elsewhere").urls] == ["step_4", "step_2"]
    storage.save(root, 5, _state(5), keep_last=1)  # retention walks the folder too
    fs, path = fsspec.core.url_to_fs(root)
    assert [s for s, _ in storage.list_complete(root)] == [5]
    assert fs.cat_file(f"{path}/step_999") == b"not a checkpoint\n", "not ours: never deleted"


def test_the_driver_lists_the_same_and_notes_what_it_skips(run: str):
    fs, path = fsspec.core.url_to_fs(run)
    found = checkpoint_list.of_run(fs, path)
    assert found.complete == [(2, "step_2"), (4, "step_4")] and found.newest == "step_4"
    assert [name for name, _ in found.skipped] == ["step_7", "step_999"]
    assert driver_resume.newest_checkpoint(run) == "step_4"
    notes = driver_resume.skipped_notes(run)
    assert notes == [f"{run}: checkpoints/step_7 is not a complete checkpoint (no meta.json: a save that never"
                     " committed); skipped",
                     f"{run}: checkpoints/step_999 is not a complete checkpoint (a file, not a checkpoint folder);"
                     " skipped"]
    assert driver_resume.skipped_notes(f"{run}/checkpoints") == notes
    assert driver_resume.skipped_notes(f"{run}/checkpoints/step_4") == []  # named explicitly: nothing passed over


def test_ddp_export_skips_a_stray_file_with_a_note(run: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    export_cli.main([run, "--out", str(tmp_path / "out")])  # was: refused, [Errno 20] Not a directory
    captured = capsys.readouterr()
    assert "ddp-export: note: checkpoints/step_999 is not a complete checkpoint (a file" in captured.err
    assert "step 4 of" in captured.out and (tmp_path / "out" / "model.safetensors").exists()
