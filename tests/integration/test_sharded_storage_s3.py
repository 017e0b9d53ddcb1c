"""A staged (sharded) save through storage.py, on a local disk and on a real S3 server (moto on loopback): other
ranks' files committed with the state, sizes checked on load, uncommitted stages never listed and cleaned up."""

from __future__ import annotations

import sys
from pathlib import Path

import fsspec
import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from ddp_runner.tasks.engine import checkpoint as ck  # noqa: E402
from ddp_runner.tasks.engine.checkpoint import storage  # noqa: E402


@pytest.fixture(params=["local", "s3"])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return str(tmp_path) if request.param == "local" else request.getfixturevalue("s3_url") + "/ck"


def _staged_save(root: str, step: int, payload: bytes = b"x" * 100) -> str:
    tmp = storage.stage_dir(root, step)
    assert step not in [s for s, _ in ck.list_complete(root)], "a staged directory is not a checkpoint"
    with fsspec.open(f"{tmp}/shards/__0_0.distcp", "wb", auto_mkdir=True) as f:
        f.write(payload)  # what DCP's ranks would write
    return ck.save(root, step, {"sharded": "shards", "v": torch.tensor([step])}, keep_last=2, staged=tmp)


def test_an_object_store_stage_drops_an_earlier_attempts_files(s3_url):  # noqa: F811 - fixture
    root = s3_url + "/ck"
    tmp = storage.stage_dir(root, 5)
    with fsspec.open(f"{tmp}/shards/__3_0.distcp", "wb") as f:
        f.write(b"a 4-rank attempt that never committed")
    url = _staged_save(root, 5)
    assert set(storage._read_meta(*storage._split_ckpt_url(url))["files"]) == {"shards/__0_0.distcp"}
