"""A staged (sharded) save through storage.py, on a local disk and on a real S3 server (moto on loopback): other
ranks' files committed with the state, sizes checked on load, uncommitted stages never listed and cleaned up."""

from __future__ import annotations

import fsspec

from ddp_runner.tasks.engine.checkpoint import listing, paths, storage
from tests.support.checkpoints import staged_save


def test_an_object_store_stage_drops_an_earlier_attempts_files(s3_url):
    root = s3_url + "/ck"
    tmp = storage.stage_dir(root, 5)
    with fsspec.open(f"{tmp}/shards/__3_0.distcp", "wb") as f:
        f.write(b"a 4-rank attempt that never committed")
    url = staged_save(root, 5)
    assert set(listing.read_meta(*paths.split_ckpt_url(url))["files"]) == {"shards/__0_0.distcp"}
