"""A staged (sharded) save through storage.py: other ranks' files committed with the state, sizes checked."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tasks.engine import checkpoint as ck  # noqa: E402
from tasks.engine.checkpoint import storage  # noqa: E402


def _staged_save(root: Path, step: int, payload: bytes = b"x" * 100) -> str:
    tmp = storage.stage_dir(str(root), step)
    assert step not in [s for s, _ in ck.list_complete(str(root))], "a staged directory is not a checkpoint"
    (Path(tmp) / "shards").mkdir()
    (Path(tmp) / "shards" / "__0_0.distcp").write_bytes(payload)  # what DCP's ranks would write
    return ck.save(str(root), step, {"sharded": "shards", "v": torch.tensor([step])}, keep_last=2, staged=tmp)


def test_staged_files_are_committed_with_their_sizes_and_checked_on_load(tmp_path):
    url = _staged_save(tmp_path, 3)
    assert [Path(u).name for _, u in ck.list_complete(str(tmp_path))] == ["step_3"]
    assert ck.load(url)["sharded"] == "shards"
    shard = tmp_path / "step_3" / "shards" / "__0_0.distcp"
    shard.write_bytes(b"short")
    with pytest.raises(ck.CheckpointError, match="shards/__0_0.distcp is 5 bytes"):
        ck.load(url)
    shard.unlink()
    with pytest.raises(ck.CheckpointError, match="missing"):
        ck.load(url)


def test_keep_last_counts_sharded_checkpoints_and_removes_dead_stages(tmp_path):
    for step in (1, 2, 3):
        _staged_save(tmp_path, step)
    dead = storage.stage_dir(str(tmp_path), 2)  # a save that never committed (a rank died)
    _staged_save(tmp_path, 4)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_3", "step_4"]
    assert not Path(dead).exists()


def test_sharded_saves_need_a_local_filesystem():
    with pytest.raises(ck.CheckpointError, match="local or shared filesystem"):
        storage.stage_dir("memory://bucket/ckpts", 1)
