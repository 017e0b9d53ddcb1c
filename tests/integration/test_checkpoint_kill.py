"""Checkpoint storage: round trips (local, memory://, a real S3 server), crash atomicity, retention, async
saves, refusal of unsafe pickles, RNG state."""

from __future__ import annotations

import textwrap
from pathlib import Path

import fsspec
import pytest
import torch

from ddp_runner.tasks.engine import checkpoint as ck
from tests.support.checkpoints import kill_at_commit_pause


def _names(root: str) -> set[str]:
    fs, path = fsspec.core.url_to_fs(root)
    fs.invalidate_cache(path)
    try:
        return {p.rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(path, detail=False)}
    except FileNotFoundError:
        return set()


# ------------------------------------------------------------------------------------------- atomicity

_CRASH_SCRIPT = textwrap.dedent("""
    import os, sys, torch
    from ddp_runner.tasks.engine import checkpoint as ck
    from ddp_runner.tasks.engine.diagnostics import faults
    root = sys.argv[1]
    ck.save(root, 1, {"w": torch.full((4096,), 1.0), "step": 1}, keep_last=0)
    faults.use(faults.Faults(commit_pause_s=120))  # the next save stops between payload and commit
    ck.save(root, 2, {"w": torch.full((4096,), 2.0), "step": 2}, keep_last=0, hooks=faults.save_hooks())
    print("not killed", file=sys.stderr)
""")


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_kill_during_save_leaves_previous_checkpoint(kind: str, tmp_path: Path,
                                                     request: pytest.FixtureRequest) -> None:
    root = str(tmp_path / "ck") if kind == "local" else request.getfixturevalue("s3_url") + "/ck"
    kill_at_commit_pause(_CRASH_SCRIPT, [root], 2, timeout_s=60)

    # The partial step 2 is there on storage, but invisible.
    leftovers = {n for n in _names(root) if n != "step_1"}
    if kind == "local":
        assert len(leftovers) == 1 and next(iter(leftovers)).startswith("step_2.tmp-")
    else:
        assert leftovers == {"step_2"}
        assert not ck.is_checkpoint(f"{root}/step_2")
        with pytest.raises(ck.CheckpointError, match="not a complete checkpoint"):
            ck.load(f"{root}/step_2")
    assert [s for s, _ in ck.list_complete(root)] == [1]
    assert ck.latest(root) == f"{root}/step_1"
    assert torch.equal(ck.load(ck.latest(root))["w"], torch.full((4096,), 1.0))

    # The next save (resumed from step 1) commits and removes the leftover.
    ck.save(root, 3, {"w": torch.full((4096,), 3.0), "step": 3}, keep_last=0)
    assert _names(root) == {"step_1", "step_3"}
    assert [s for s, _ in ck.list_complete(root)] == [1, 3]
