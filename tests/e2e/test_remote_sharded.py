"""Sharded (strategy=fsdp, DCP) checkpoints under an ``s3://`` root, on a real S3 server (moto on loopback).

- A save killed between the shards and the commit leaves a ``step_<N>/`` with every shard but no meta.json:
  never listed, never loaded; the previous checkpoint still loads (in-process DCP, one gloo rank), and saving
  that step again replaces the leftover.
- End to end through the CLI (tiny GPT, 2 gloo ranks): every rank writes its shards into the bucket, meta.json
  lists them; a run on one rank resumes from the 2-rank checkpoint (DCP reshards) and continues with the 2-rank
  run's losses (to 1e-3 relative, as in test_strategies.py: the same sums in another order).
"""

from __future__ import annotations

import math

import fsspec
import pytest
import torch

from ddp_runner.tasks.engine import checkpoint as ck
from tests.support.driver import ddp_run
from tests.support.s3_server import files, only_remote_run, read_json


@pytest.mark.timeout(600)  # two CLI runs of the tiny GPT on CPU
def test_fsdp_under_s3_root_commits_shards_and_resumes_on_one_rank(s3_url, text_file):  # noqa: F811 - fixture
    args = ["task=gpt", "device=cpu", f"data.path={text_file}", "batch.per_rank=4", "train.max_steps=null",
            "train.epochs=1", "checkpoint.every_steps=4", "checkpoint.async_save=false", "strategy=fsdp"]
    root = f"{s3_url}/runs"
    r = ddp_run([*args, "world_size=2"], root, timeout=400)
    assert r.returncode == 0, r.stdout + r.stderr
    run = only_remote_run(root)
    losses = read_json(f"{run}/summary.json")["losses"]
    assert len(losses) == 8
    ckpts = ck.list_complete(f"{run}/checkpoints")
    assert [u.rsplit("/", 1)[1] for _, u in ckpts] == ["step_4", "step_8"]
    for _, url in ckpts:  # every rank's shards are in the bucket and meta.json lists them with their sizes
        tree = files(url)
        shards = {"shards/.metadata", "shards/__0_0.distcp", "shards/__1_0.distcp"}
        assert shards <= tree, sorted(tree)
        listed = read_json(f"{url}/meta.json")["files"]
        assert shards <= set(listed) and set(listed) == tree - {"state.pt", "meta.json"}, listed
        fs, path = fsspec.core.url_to_fs(url)
        fs.invalidate_cache()
        assert all(fs.size(f"{path}/{rel}") == size for rel, size in listed.items())
    final = ckpts[-1][1]
    assert "model.pt" in files(final)  # the last checkpoint's consolidated model, written to the bucket too
    with fsspec.open(f"{final}/model.pt", "rb") as f:
        model = torch.load(f, weights_only=True)
    assert model["tok.weight"].shape == (256, 64)

    # step_4 of the 2-rank run on one rank at the same global batch (accumulation 2): DCP reads both ranks'
    # shards from the bucket and reshards; the run continues with the 2-rank run's losses.
    one = [*args, "world_size=1", "batch.global=8", f"resume={ckpts[0][1]}"]
    r = ddp_run(one, f"{s3_url}/one", timeout=400)
    assert r.returncode == 0, r.stdout + r.stderr
    summary = read_json(f"{only_remote_run(f'{s3_url}/one')}/summary.json")
    assert summary["resumed_from"] == ckpts[0][1]
    a = summary["losses"]
    assert a[:4] == losses[:4] and len(a) == 8
    for x, y in zip(a[4:], losses[4:], strict=True):
        assert math.isclose(x, y, rel_tol=1e-3), (a, losses)
