"""A remote output root end to end: a real S3 server (moto, on loopback), real torchrun and gloo workers.

The driver stages logs and TensorBoard files locally and mirrors them; rank 0 writes checkpoints straight to
the bucket. One run, killed and continued in place (``s3_cycle``), is read by the mirror, resume and dry-run
tests. The server's endpoint and fake credentials reach the driver and the workers through the environment the
``s3_server`` fixture sets.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import fsspec
import pytest
import torch

from ddp_runner.tasks.engine import checkpoint as ck
from tests.support.driver import ddp_run
from tests.support.recipes import SMOKE_CKPT2
from tests.support.run_tree import load_json
from tests.support.s3_server import files, only_remote_run, read_json, s3

SMOKE = SMOKE_CKPT2


@pytest.fixture
def local_run(smoke_reference: Path) -> Path:
    """The same run on a local disk (made once per session): the remote runs must reproduce its losses and
    parameters exactly."""
    return smoke_reference


def assert_same_as_local(summary: dict, final: dict, local: Path) -> None:
    assert summary["losses"] == load_json(local / "summary.json")["losses"]
    params = ck.load(local / "checkpoints/step_8")["model"]
    assert final["model"].keys() == params.keys()
    for k, v in params.items():
        assert torch.equal(final["model"][k], v), k


@pytest.fixture(scope="module")
def s3_cycle(s3_server: str, tmp_path_factory: pytest.TempPathFactory) -> dict:  # noqa: F811 - fixture
    """SMOKE under an ``s3://`` root, rank 1 SIGKILLed after step 7 (once step_6 is in the bucket), then continued
    in place to completion (once per module and server): the tests below read the run it leaves. Returns the run's
    URL, the checkpoint it resumed from, rank 0's mirrored log before the resume and the resume's stdout."""
    root = f"{s3_server}/{uuid.uuid4().hex[:12]}/crash"
    r = ddp_run([*SMOKE, "fault.kind=sigkill", "fault.rank=1", "fault.step=7"], root)
    assert r.returncode != 0, r.stdout + r.stderr
    crashed = only_remote_run(root)
    assert read_json(f"{crashed}/run.json")["status"] == "failed"
    # step_6 normally; step_4 if the rank-0 upload of step_6 was cut short when torchrun stopped it
    source = ck.latest(f"{crashed}/checkpoints")
    assert source is not None and source.rsplit("/", 1)[1] in ("step_4", "step_6"), source
    log_before = s3().cat_file(f"{crashed}/logs/rank0.log").decode()

    r = ddp_run([f"resume={crashed}"], tmp_path_factory.mktemp("unused"))
    assert r.returncode == 0, r.stdout + r.stderr
    return {"run": crashed, "source": source, "log_before": log_before, "stdout": r.stdout}


def test_run_under_s3_root_mirrors_the_whole_tree(s3_cycle, local_run):
    """The run's whole tree is in the bucket (the one of s3_cycle: its first attempt's files and its second's)."""
    run = s3_cycle["run"]
    assert s3_cycle["stdout"].strip().splitlines()[-1] == run

    tree = files(run)
    for f in ("config.yaml", "run.json", "summary.json", "logs/rank0.log", "logs/rank1.log", "logs/rank0.json",
              "checkpoints/step_8/state.pt", "checkpoints/step_8/meta.json"):
        assert f in tree, (f, sorted(tree))
    assert any(f.startswith("tb/events.out.tfevents.") for f in tree), sorted(tree)
    assert "rank 0 device cpu:0 completed" in s3().cat_file(f"{run}/logs/rank0.log").decode()
    assert read_json(f"{run}/run.json")["status"] == "completed"
    summary = read_json(f"{run}/summary.json")
    assert summary["status"] == "completed" and summary["steps"] == 8
    # The workers reached the server themselves: rank 0 wrote these checkpoints straight into the bucket (keep_last
    # 2; a step_4 it resumed from is kept too).
    kept = ["step_6", "step_8"] if s3_cycle["source"].endswith("step_6") else ["step_4", "step_6", "step_8"]
    assert [u.rsplit("/", 1)[1] for _, u in ck.list_complete(f"{run}/checkpoints")] == kept
    final = ck.load(f"{run}/checkpoints/step_8")
    assert final["progress"]["step"] == 8 and final["progress"]["losses"] == summary["losses"]
    assert_same_as_local(summary, final, local_run)


def test_s3_run_killed_then_resumed_in_place(s3_cycle, local_run):
    # Rank 1 was SIGKILLed after step 7, once step_6 was in the bucket; then the remote run was continued in place
    # (s3_cycle).
    crashed, source, log_before = s3_cycle["run"], s3_cycle["source"], s3_cycle["log_before"]
    assert s3_cycle["stdout"].strip().splitlines()[-1] == crashed
    manifest, summary = read_json(f"{crashed}/run.json"), read_json(f"{crashed}/summary.json")
    assert manifest["status"] == "completed" and len(manifest["continued"]) == 1
    assert summary["resumed_from"] == source
    final = ck.load(ck.latest(f"{crashed}/checkpoints"))
    assert final["progress"]["step"] == 8
    assert_same_as_local(summary, final, local_run)
    # The mirrored log kept the first attempt's lines and gained the second's; no stale error record.
    log_after = s3().cat_file(f"{crashed}/logs/rank0.log").decode()
    assert log_after.startswith(log_before) and "resumed from" in log_after[len(log_before):]
    assert not [f for f in files(crashed) if f.endswith(".error.json")]
    assert any(f.startswith("tb/events.out.tfevents.") for f in files(crashed))


def test_dry_run_of_a_remote_continue_leaves_no_local_staging(s3_cycle, tmp_path):
    run = s3_cycle["run"]  # the completed 8-step run of the tests above (a dry run changes nothing in it)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    # (a completed run continues only when trained longer: train.max_steps above its 8 steps)
    r = ddp_run([f"resume={run}", "train.max_steps=10", "dry_run=true"], tmp_path / "unused",
                env={"TMPDIR": str(tmp)})
    assert r.returncode == 0 and "dry run, nothing launched" in r.stdout, r.stdout + r.stderr
    assert not [p for p in tmp.iterdir() if p.name.startswith("ddp-run-")]


def test_a_root_in_a_missing_bucket_is_refused_and_no_bucket_is_made(s3_url, tmp_path):  # noqa: F811 - fixture
    """Guards against s3fs's makedirs creating a bucket from a typo in output.root (it did, and the run went on)."""
    bucket = f"no-such-bucket-{tmp_path.name[-8:].lower().replace('_', '-')}"
    root = s3_url.replace(s3_url.split("/")[2], bucket, 1)
    r = ddp_run(["task=smoke", "device=cpu", "world_size=1", "train.max_steps=1"], root)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "key:   output.root" in r.stderr and f"bucket '{bucket}' does not exist" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    fs = fsspec.filesystem("s3")
    fs.invalidate_cache()
    assert not fs.exists(bucket), "a bucket was created"
