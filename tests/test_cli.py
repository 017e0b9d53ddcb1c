"""The CLI as a user meets it: refusals (exit 2, nothing created), dry runs, help."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import ddp_run, run_dirs


@pytest.mark.parametrize("args, key, value", [
    (["device=cuda"], "device", "'cuda'"),
    (["backend=nccl"], "backend", "'nccl'"),
    (["world_size=0"], "world_size", "0"),
    (["batch.per_rank=-4"], "batch.per_rank", "-4"),
    (["batch.global=30"], "batch.global", "30"),
    (["data.num_samples=12"], "batch.per_rank", "8"),
    (["task=nope"], "task", "'nope'"),
    (["train.precision=fp8"], "train.precision", "'fp8'"),
    (["train.ddp_comm=fp8"], "train.ddp_comm", "'fp8'"),
    (["train.ddp_comm=bf16"], "train.ddp_comm", "'bf16'"),  # bf16 all-reduce needs NCCL; gloo here
    (["train.profile.steps=-1"], "train.profile.steps", "-1"),
    (["train.gpu_telemetry=sometimes"], "train.gpu_telemetry", "'sometimes'"),
    (["train.ddp_split_graph=maybe"], "train.ddp_split_graph", "'maybe'"),
    (["train.ddp_bucket_mb=0"], "train.ddp_bucket_mb", "0"),
    (["world_size=2", "train.compile=true", "train.ddp_bucket_mb=0.5"], "train.ddp_bucket_mb", "0.5"),
    (["train.compile=true", "+train.inductor.no_such_setting=true"], "train.inductor.no_such_setting", "True"),
    (["train.compile=true", "+train.inductor.combo_kernels=3"], "train.inductor.combo_kernels", "3"),
    (["+train.inductor.combo_kernels=true"], "train.inductor.combo_kernels", "True"),  # compile is off
    (["task=gpt", "task.model.loss=chunky"], "task.model.loss", "'chunky'"),
])
def test_refusal_names_key_value_fix_and_creates_nothing(args, key, value, out_root):
    r = ddp_run(["device=cpu", *args] if "device=" not in args[0] else args, out_root)
    assert r.returncode == 2, r.stderr
    assert f"key:   {key}" in r.stderr and f"value: {value}" in r.stderr and "fix:" in r.stderr
    assert not out_root.exists(), "a refused plan must leave no directory"


def test_device_cuda_refused_even_with_visible_devices_env(out_root):
    r = ddp_run(["device=cuda"], out_root, env={"CUDA_VISIBLE_DEVICES": "0,1"})
    assert r.returncode == 2 and "no CUDA device is visible" in r.stderr


def test_unwritable_output_root_is_refused(tmp_path: Path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    r = ddp_run(["device=cpu"], blocker / "outputs")
    assert r.returncode == 2, r.stderr
    assert "key:   output.root" in r.stderr and "fix:" in r.stderr
    assert blocker.read_text() == "not a directory"


def test_dry_run_prints_plan_and_command_and_launches_nothing(out_root):
    r = ddp_run(["device=cpu", "batch.per_rank=4", "batch.global=32", "dry_run=true"], out_root)
    assert r.returncode == 0, r.stderr
    assert "global batch 32 = 4 per rank × 2 ranks × 4 accumulation" in r.stdout
    assert "--nproc-per-node=2" in r.stdout and "-m tasks" in r.stdout
    assert not out_root.exists()


def test_help_lists_config_groups(out_root):
    r = ddp_run(["--help"], out_root)
    assert r.returncode == 0
    for group in ("task:", "data:", "launcher:", "smoke"):
        assert group in r.stdout
    assert run_dirs(out_root.parent) == []
