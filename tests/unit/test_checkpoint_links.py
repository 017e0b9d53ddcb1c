"""Issue 51 (polish): a dangling or looping symbolic link named ``step_<N>`` in a checkpoints folder is named as
the link it is, not as "a file", by every reader of the folder (the driver's listing and ``ddp-runs show``, a
resume's check of a checkpoint named explicitly, the workers' storage)."""

from __future__ import annotations

from pathlib import Path

import fsspec
import pytest
import torch

from ddp_runner.rundir import checkpoint_list
from ddp_runner.rundir import resume as driver_resume
from ddp_runner.tasks.engine.checkpoint import storage

DANGLING = "a dangling symbolic link: its target nowhere does not exist"
LOOPING = "a symbolic link that loops back on itself (via step_9)"


@pytest.fixture
def run(tmp_path: Path) -> Path:
    """A run whose checkpoints folder holds step_2, step_5 (a link to nowhere) and step_9 (a link to itself)."""
    run = tmp_path / "run"
    ckpts = run / "checkpoints"
    storage.save(str(ckpts), 2, {"model": {"w": torch.zeros(2)}, "progress": {"step": 2}}, keep_last=0)
    (ckpts / "step_5").symlink_to("nowhere")
    (ckpts / "step_9").symlink_to("step_9")
    return run


def test_the_driver_names_the_links(run: Path) -> None:
    fs, path = fsspec.core.url_to_fs(str(run))
    found = checkpoint_list.of_run(fs, path)
    assert found.skipped == [("step_5", DANGLING), ("step_9", LOOPING)], found
    assert not any("a file" in note for note in found.notes())
    assert driver_resume.checkpoint_problem(fs, f"{path}/checkpoints/step_5") == f"step_5: {DANGLING}"
    assert driver_resume.checkpoint_problem(fs, f"{path}/checkpoints/step_9") == f"step_9: {LOOPING}"


def test_the_workers_name_the_links(run: Path) -> None:
    root = str(run / "checkpoints")
    assert storage.list_skipped(root) == [("step_5", DANGLING), ("step_9", LOOPING)]
    assert [s for s, _ in storage.list_complete(root)] == [2]
