"""A staged (sharded) save through storage.py, on a local disk and on a real S3 server (moto on loopback): other
ranks' files committed with the state, sizes checked on load, uncommitted stages never listed and cleaned up."""

from __future__ import annotations

from pathlib import Path

import fsspec
import pytest

from ddp_runner.tasks.engine import checkpoint as ck
from ddp_runner.tasks.engine.checkpoint import storage
from tests.support.checkpoints import staged_save


@pytest.fixture(params=["local", "s3"])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return str(tmp_path) if request.param == "local" else request.getfixturevalue("s3_url") + "/ck"


def _fs(url: str) -> fsspec.AbstractFileSystem:
    fs = fsspec.core.url_to_fs(url)[0]
    fs.invalidate_cache()
    return fs


def _names(root: str) -> list[str]:
    fs = _fs(root)
    return sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(fsspec.core.url_to_fs(root)[1], detail=False))


def test_staged_files_are_committed_with_their_sizes_and_checked_on_load(root):
    url = staged_save(root, 3)
    assert [u.rsplit("/", 1)[-1] for _, u in ck.list_complete(root)] == ["step_3"]
    assert ck.load(url)["sharded"] == "shards"
    assert _fs(url).cat_file(f"{fsspec.core.url_to_fs(url)[1]}/meta.json").count(b"shards/__0_0.distcp") == 1
    shard = f"{url}/shards/__0_0.distcp"
    _fs(shard).pipe_file(fsspec.core.url_to_fs(shard)[1], b"short")
    with pytest.raises(ck.CheckpointError, match="shards/__0_0.distcp is 5 bytes"):
        ck.load(url)
    _fs(shard).rm_file(fsspec.core.url_to_fs(shard)[1])
    with pytest.raises(ck.CheckpointError, match="missing"):
        ck.load(url)


def test_keep_last_counts_sharded_checkpoints_and_removes_dead_stages(root):
    for step in (1, 2, 3):
        staged_save(root, step)
    dead = storage.stage_dir(root, 2)  # a save that never committed (a rank died)
    with fsspec.open(f"{dead}/shards/__1_0.distcp", "wb", auto_mkdir=True) as f:
        f.write(b"partial")
    staged_save(root, 4)
    assert _names(root) == ["step_3", "step_4"]
    assert not _fs(dead).exists(fsspec.core.url_to_fs(dead)[1])
