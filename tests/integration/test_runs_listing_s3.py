"""ddp-runs over an object store (a real S3 server on loopback, moto): the same listing and ``show`` as on a local
disk, from the run tree's files alone (an object store has no directories, only key prefixes)."""

from __future__ import annotations

import json
import time
from datetime import datetime
from pathlib import Path

from ddp_runner.contract import checkpoints, layout
from ddp_runner.report import runs
from ddp_runner.rundir import listing


def _tree(local: Path) -> None:
    started = datetime.fromtimestamp(time.time() - 600).isoformat(timespec="seconds")
    plan = {"world_size": 2, "per_rank_batch": 8, "accumulation": 1, "global_batch": 16, "device": "cpu",
            "backend": "gloo", "nnodes": 1, "explanation": "global batch 16 = 8 per rank × 2 ranks × 1 accumulation"}
    gone = {"host": "another-host", "pid": 1, "started": 0.0, "heartbeat": time.time() - 3600}
    for name, status in (("10-00-00_smoke_w2", "completed"), ("11-00-00_smoke_w2", "running")):
        run = local / "2026-12-01" / name
        (run / layout.CHECKPOINTS / "step_4").mkdir(parents=True)
        (run / layout.CHECKPOINTS / "step_4" / layout.CKPT_STATE).write_bytes(b"w")  # committed as the workers do
        (run / layout.CHECKPOINTS / "step_4" / layout.CKPT_MARKER).write_text(json.dumps({
            "format": checkpoints.FORMAT, "step": 4, "bytes": 1, "sha256": "", "state_file": layout.CKPT_STATE}))
        (run / layout.CONFIG).write_text("train:\n  max_steps: 8\n")
        (run / layout.MANIFEST).write_text(json.dumps({"status": status, "task": "smoke", "plan": plan,
                                                       "started": started, "driver": gone}))
        if status == "completed":
            (run / layout.SUMMARY).write_text(json.dumps({"status": status, "global_batch": 16, "steps": 8,
                                                          "losses": [1.0, 0.5], "median": {"step_time_s": 0.02}}))
    (local / "2026-12-01" / "12-00-00_smoke_w2").mkdir()
    (local / "2026-12-01" / "12-00-00_smoke_w2" / layout.MANIFEST).write_text("{}")  # a remote run being created


def test_a_remote_root_lists_and_shows_like_a_local_one(s3_url: str, tmp_path: Path) -> None:
    import fsspec

    _tree(tmp_path / "outputs")
    fs = fsspec.filesystem("s3")
    fs.put(str(tmp_path / "outputs") + "/", s3_url.removeprefix("s3://") + "/outputs", recursive=True)
    fs.invalidate_cache()
    root = f"{s3_url}/outputs"
    found = listing.scan(root)
    assert [(r.name, r.status) for r in found.rows] == [("2026-12-01/11-00-00_smoke_w2", "lost"),
                                                       ("2026-12-01/10-00-00_smoke_w2", "completed")]
    done = found.rows[1]
    assert (done.step, done.max_steps, done.last_loss, done.throughput, done.unit) == (8, 8, 0.5, 800.0, "samples/s")
    assert done.url == f"{root}/2026-12-01/10-00-00_smoke_w2"
    assert found.skipped == [("2026-12-01/12-00-00_smoke_w2", "run.json is empty (its driver died while creating it?)")]
    text = runs.describe(found.rows[0].url)
    assert f"continue    ddp-run resume={found.rows[0].url}    # in place, from step_4" in text
