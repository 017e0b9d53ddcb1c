"""Sharded (strategy=fsdp, DCP) checkpoints under an ``s3://`` root, on a real S3 server (moto on loopback).

- A save killed between the shards and the commit leaves a ``step_<N>/`` with every shard but no meta.json:
  never listed, never loaded; the previous checkpoint still loads (in-process DCP, one gloo rank), and saving
  that step again replaces the leftover.
- End to end through the CLI (tiny GPT, 2 gloo ranks): every rank writes its shards into the bucket, meta.json
  lists them; a run on one rank resumes from the 2-rank checkpoint (DCP reshards) and continues with the 2-rank
  run's losses (to 1e-3 relative, as in test_strategies.py: the same sums in another order).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import fsspec
import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]

from ddp_runner.tasks.engine import checkpoint as ck  # noqa: E402
from ddp_runner.tasks.engine.checkpoint import listing, paths, sharded  # noqa: E402
from tests.support.checkpoints import kill_at_commit_pause, subprocess_env  # noqa: E402
from tests.support.s3_server import files  # noqa: E402

_CRASH_SCRIPT = textwrap.dedent("""
    import sys, torch, torch.distributed as dist
    from ddp_runner.tasks.engine.checkpoint import sharded
    from ddp_runner.tasks.engine.diagnostics import faults
    root, store = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    def shards(v):
        return {"model": {"w": torch.full((4096,), v)}, "optim": {"m": torch.full((8,), v)}}
    sharded.save(root, 1, {"step": 1}, shards(1.0), keep_last=0)
    faults.use(faults.Faults(commit_pause_s=120))  # the next save stops between its files and meta.json
    sharded.save(root, 2, {"step": 2}, shards(2.0), keep_last=0, hooks=faults.save_hooks())
    print("not killed", file=sys.stderr)
""")

_RESAVE_SCRIPT = textwrap.dedent("""
    import sys, torch, torch.distributed as dist
    from ddp_runner.tasks.engine.checkpoint import sharded
    root, store = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    shards = {"model": {"w": torch.full((4096,), 2.5)}, "optim": {"m": torch.full((8,), 2.5)}}
    sharded.save(root, 2, {"step": 2}, shards, keep_last=0)
""")


def test_a_sharded_save_killed_before_its_commit_is_never_listed(s3_url, tmp_path):  # noqa: F811 - fixture
    root = f"{s3_url}/ck"
    kill_at_commit_pause(_CRASH_SCRIPT, [root, str(tmp_path / "store")], 2)

    # step_2's shards and state.pt are in the bucket, but no meta.json: not a checkpoint.
    left = files(f"{root}/step_2")
    assert {"state.pt", "shards/.metadata", "shards/__0_0.distcp"} <= left and "meta.json" not in left, left
    assert not ck.is_checkpoint(f"{root}/step_2")
    with pytest.raises(ck.CheckpointError, match="not a complete checkpoint"):
        ck.load(f"{root}/step_2")
    assert [s for s, _ in ck.list_complete(root)] == [1]

    # step_1 loads, its shards through DCP's fsspec reader, and its meta.json covers them.
    url = ck.latest(root)
    state = ck.load(url)
    assert set(listing.read_meta(*paths.split_ckpt_url(url))["files"]) == {"shards/.metadata",
                                                                           "shards/__0_0.distcp"}
    got = {"model": {"w": torch.zeros(4096)}, "optim": {"m": torch.zeros(8)}}
    sharded.load_shards(url, state, got)  # no process group: DCP reads on its own
    assert torch.equal(got["model"]["w"], torch.full((4096,), 1.0))
    assert torch.equal(got["optim"]["m"], torch.full((8,), 1.0))
    # A shard cut short is caught by the integrity check before DCP reads it.
    fs, path = fsspec.core.url_to_fs(f"{url}/shards/__0_0.distcp")
    fs.pipe_file(path, fs.cat_file(path)[:-1])
    with pytest.raises(ck.CheckpointError, match="__0_0.distcp is"):
        ck.load(url)

    # The run resumed from step_1 saves step 2 again: the leftover is replaced, then committed.
    subprocess.run([sys.executable, "-c", _RESAVE_SCRIPT, root, str(tmp_path / "store2")], env=subprocess_env(),
                   cwd=ROOT, check=True, timeout=120)
    assert [s for s, _ in ck.list_complete(root)] == [1, 2]
    url = ck.latest(root)
    got = {"model": {"w": torch.zeros(4096)}, "optim": {"m": torch.zeros(8)}}
    sharded.load_shards(url, ck.load(url), got)
    assert torch.equal(got["model"]["w"], torch.full((4096,), 2.5))
