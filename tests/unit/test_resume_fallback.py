"""A resume passes over a checkpoint that fails its integrity check (size or sha256 against meta.json) for the
newest older one that passes, and says so; a checkpoint named explicitly fails with the reason; keep_last never
deletes the checkpoint just written for a newer one that may be corrupt.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ddp_runner.tasks.engine import checkpoint as ck
from tests.support.checkpoint_damage import complete_names, flip_byte, step_state, truncate


@pytest.mark.parametrize("corrupt, why", [(truncate, "bytes"), (flip_byte, "sha256")])
def test_the_newest_that_passes_is_loaded_and_the_others_are_named(tmp_path, corrupt, why):
    for step in (2, 4, 6):
        ck.save(str(tmp_path), step, step_state(step), keep_last=0)
    corrupt(tmp_path / "step_6")
    newest_first = [u for _, u in reversed(ck.list_complete(str(tmp_path)))]
    loaded, url, skipped = ck.load_first_good(newest_first)
    assert url.endswith("step_4") and loaded["step"] == 4
    assert [Path(u).name for u, _ in skipped] == ["step_6"] and why in skipped[0][1]
    with pytest.raises(ck.CheckpointError, match=why):  # named explicitly: its failure is the answer
        ck.load(str(tmp_path / "step_6"))


def test_none_passing_names_every_reason(tmp_path):
    for step in (2, 4):
        ck.save(str(tmp_path), step, step_state(step), keep_last=0)
    truncate(tmp_path / "step_4")
    flip_byte(tmp_path / "step_2")
    with pytest.raises(ck.CheckpointError, match=r"step_4.*bytes.*step_2.*sha256"):
        ck.load_first_good([u for _, u in reversed(ck.list_complete(str(tmp_path)))])


def test_keep_last_never_deletes_the_checkpoint_that_passed_for_a_newer_corrupt_one(tmp_path):
    # An earlier attempt left step_4 and step_6; step_6 is corrupt, so the resume took step_4 (protected). The
    # resumed run saves step_5 with keep_last=1: counting the corrupt step_6 as the one to keep, retention used to
    # delete step_5 at once, the newest checkpoint that passes.
    for step in (4, 6):
        ck.save(str(tmp_path), step, step_state(step), keep_last=2)
    truncate(tmp_path / "step_6")
    protect = frozenset({str(tmp_path / "step_4")})
    ck.save(str(tmp_path), 5, step_state(5), keep_last=1, protect=protect)
    assert complete_names(tmp_path) == ["step_4", "step_5", "step_6"]
    _, url, _ = ck.load_first_good([u for _, u in reversed(ck.list_complete(str(tmp_path)))])
    assert url.endswith("step_5")
    ck.save(str(tmp_path), 6, step_state(6), keep_last=1, protect=protect)  # replaces the corrupt one
    assert complete_names(tmp_path) == ["step_4", "step_6"] and ck.load(str(tmp_path / "step_6"))["step"] == 6
