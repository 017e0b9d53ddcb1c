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


# -- Hydra hygiene: every problem with the command line is a refusal (exit 2) that names the key and the fix ----

@pytest.mark.parametrize("args, key, hint", [
    (["batch.perrank=3"], "batch.perrank", "batch.per_rank"),
    (["+train.lrr=0.1"], "train.lrr", "train.lr"),
    (["+batch.per_rnak=4"], "batch.per_rnak", "batch.per_rank"),
    (["~train.lr"], "~train.lr", "train.lr=<value>"),
    (["~task.module"], "~task.module", "task.module=<value>"),
    (["+experiment=nope"], "experiment", "fixed_global_batch"),
    (["data=mine"], "data", "synthetic"),
    (["train.lr=[1"], "overrides", "ddp-run --help"),
])
def test_command_line_mistakes_are_refused_with_the_fix(out_root, args, key, hint):
    r = ddp_run(["device=cpu", *args], out_root)
    assert r.returncode == 2, r.stderr
    assert f"key:   {key}" in r.stderr and hint in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and not out_root.exists()


def test_swept_group_values_are_all_checked_before_the_first_job(out_root):
    r = ddp_run(["-m", "task=smoke,nope", "device=cpu"], out_root)
    assert r.returncode == 2 and "key:   task" in r.stderr and "'nope'" in r.stderr
    assert not out_root.exists()


def test_free_form_keys_stay_open(out_root):
    """New keys of a task's own, and torch._inductor settings, may be added with +."""
    r = ddp_run(["device=cpu", "dry_run=true", "+task.note=hello"], out_root)
    assert r.returncode == 0, r.stderr


def test_experiment_is_a_group(out_root):
    r = ddp_run(["device=cpu", "dry_run=true", "experiment=fixed_global_batch", "world_size=1"], out_root)
    assert r.returncode == 0, r.stderr
    assert "global batch 32 = 8 per rank × 1 rank × 4 accumulation" in r.stdout


def test_version_is_the_package_version(out_root):
    from importlib.metadata import version

    r = ddp_run(["--version"], out_root)
    assert r.returncode == 0 and r.stdout.strip() == f"ddp-run {version('ddp-runner')}"


@pytest.mark.parametrize("flag", [["--config-dir={d}"], ["--config-dir", "{d}"], ["-cd", "{d}"]])
def test_config_dir_in_every_spelling_adds_groups(out_root, tmp_path, flag):
    conf = tmp_path / "myconf"
    (conf / "data").mkdir(parents=True)
    (conf / "data" / "mine.yaml").write_text("name: synthetic\nnum_samples: 48\nseed: 3\n")
    args = [f.format(d=conf) for f in flag]
    r = ddp_run([*args, "data=mine", "device=cpu", "dry_run=true"], out_root)
    assert r.returncode == 0, r.stderr
    assert "num_samples: 48" not in r.stderr


# -- task modules -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("source, problem", [
    (None, "no such module"),
    ("def make(cfg, device):\n    pass\n", "defines no build()"),
    ("import no_such_package_xyz\n\ndef build(cfg, device):\n    pass\n", "no_such_package_xyz"),
    ("def build(cfg, device)\n", "SyntaxError"),
])
def test_task_module_problems_are_refused_before_launch(out_root, tmp_path, source, problem):
    if source is not None:
        (tmp_path / "mytask.py").write_text(source)
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "runner", "task.module=mytask", "device=cpu", f"output.root={out_root}"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "key:   task.module" in r.stderr and problem in r.stderr, r.stderr
    assert not out_root.exists()


def test_hydra_searchpath_adds_groups_too(out_root, tmp_path):
    conf = tmp_path / "extra"
    (conf / "data").mkdir(parents=True)
    (conf / "data" / "mine.yaml").write_text("name: synthetic\nnum_samples: 48\nseed: 3\n")
    r = ddp_run([f"hydra.searchpath=[file://{conf}]", "data=mine", "device=cpu", "dry_run=true"], out_root)
    assert r.returncode == 0, r.stderr


@pytest.mark.slow
def test_a_run_directory_reruns_its_exact_config(out_root, tmp_path):
    """The run's saved config.yaml, given back with --config-dir, is not shadowed by the package's own."""
    import json

    first = ddp_run(["device=cpu", "batch.global=32", "train.lr=0.05", "world_size=1"], out_root)
    assert first.returncode == 0, first.stderr
    (run,) = run_dirs(out_root)
    again_root = tmp_path / "again"
    r = ddp_run(["--config-dir", str(run), "--config-name", "config"], again_root)
    assert r.returncode == 0, r.stderr
    (rerun,) = run_dirs(again_root)

    def without_root(p: Path) -> list[str]:
        return [ln for ln in (p / "config.yaml").read_text().splitlines() if "root:" not in ln]

    assert without_root(rerun) == without_root(run)
    manifest = json.loads((rerun / "run.json").read_text())
    assert manifest["invocation"]["config_sources"][0] == str(run)
    assert manifest["invocation"]["argv"][:3] == ["ddp-run", "--config-dir", str(run)]


def test_an_object_store_without_credentials_is_refused_in_one_sentence(out_root, tmp_path):
    env = {"AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": "", "AWS_SESSION_TOKEN": "", "AWS_PROFILE": "",
           "AWS_EC2_METADATA_DISABLED": "true", "AWS_CONFIG_FILE": str(tmp_path / "none"),
           "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none")}
    import os
    import subprocess
    import sys

    full = {k: v for k, v in {**os.environ, **env}.items() if v != ""}
    r = subprocess.run([sys.executable, "-m", "runner", "device=cpu", "output.root=s3://ddp-runner-no-such-bucket/x"],
                       capture_output=True, text=True, timeout=120, env=full, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert "key:   output.root" in r.stderr and "credentials" in r.stderr and "Traceback" not in r.stderr
