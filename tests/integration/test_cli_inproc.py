"""The CLI as a user meets it, through ``ddp_runner.cli.main()`` in this process (the ``cli`` fixture): refusals (exit
2, the key, the value and the fix, nothing created), dry runs, help and the version. Each call ends before anything is
launched, so no interpreter is started for it; tests/e2e/test_cli.py proves the same through ``python -m ddp_runner``
for a few of them (the exit code of a real process, no run directory)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.run_tree import run_dirs


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
def test_refusal_names_key_value_fix_and_creates_nothing(args, key, value, out_root, cli):
    r = cli(["device=cpu", *args] if "device=" not in args[0] else args, out_root)
    assert r.returncode == 2, r.stderr
    assert f"key:   {key}" in r.stderr and f"value: {value}" in r.stderr and "fix:" in r.stderr
    assert not out_root.exists(), "a refused plan must leave no directory"


def test_device_cuda_refused_even_with_visible_devices_env(out_root, cli):
    r = cli(["device=cuda"], out_root, env={"CUDA_VISIBLE_DEVICES": "0,1"})
    assert r.returncode == 2 and "no CUDA device is visible" in r.stderr


def test_unwritable_output_root_is_refused(tmp_path: Path, cli):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    r = cli(["device=cpu"], blocker / "outputs")
    assert r.returncode == 2, r.stderr
    assert "key:   output.root" in r.stderr and "fix:" in r.stderr
    assert blocker.read_text() == "not a directory"


def test_dry_run_prints_plan_and_command_and_launches_nothing(out_root, cli):
    r = cli(["device=cpu", "batch.per_rank=4", "batch.global=32", "dry_run=true"], out_root)
    assert r.returncode == 0, r.stderr
    assert "global batch 32 = 4 per rank × 2 ranks × 4 accumulation" in r.stdout
    assert "--nproc-per-node=2" in r.stdout and "-m ddp_runner.tasks" in r.stdout
    assert not out_root.exists()


def test_help_lists_config_groups(out_root, cli):
    r = cli(["--help"], out_root)
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
    (["status"], "overrides", "to list your runs: ddp-runs [ROOT]; to see one run: ddp-runs show DIR"),
    # `+` on a key that exists: named, with both fixes (set it without the `+`, or force it with `++`)
    (["+train.lr=0.1"], "train.lr", "drop the +: train.lr=0.1 (or ++train.lr=0.1"),
    (["task=gpt", "+task.model.layers=4"], "task.model.layers",
     "drop the +: task.model.layers=4 (or ++task.model.layers=4"),
])
def test_command_line_mistakes_are_refused_with_the_fix(out_root, args, key, hint, cli):
    r = cli(["device=cpu", *args], out_root)
    assert r.returncode == 2, r.stderr
    assert f"key:   {key}" in r.stderr and hint in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and not out_root.exists()


def test_swept_group_values_are_all_checked_before_the_first_job(out_root, cli):
    r = cli(["-m", "task=smoke,nope", "device=cpu"], out_root)
    assert r.returncode == 2 and "key:   task" in r.stderr and "'nope'" in r.stderr
    assert not out_root.exists()


def test_free_form_keys_stay_open(out_root, cli):
    """New keys of a task's own, and torch._inductor settings, may be added with +."""
    r = cli(["device=cpu", "dry_run=true", "+task.note=hello"], out_root)
    assert r.returncode == 0, r.stderr


def test_experiment_is_a_group(out_root, cli):
    r = cli(["device=cpu", "dry_run=true", "experiment=fixed_global_batch", "world_size=1"], out_root)
    assert r.returncode == 0, r.stderr
    assert "global batch 32 = 8 per rank × 1 rank × 4 accumulation" in r.stdout


def test_version_is_the_package_version(out_root, cli):
    from importlib.metadata import version

    r = cli(["--version"], out_root)
    assert r.returncode == 0 and r.stdout.strip() == f"ddp-run {version('ddp-runner')}"


@pytest.mark.parametrize("flag", [["--config-dir={d}"], ["--config-dir", "{d}"], ["-cd", "{d}"]])
def test_config_dir_in_every_spelling_adds_groups(out_root, tmp_path, flag, cli):
    conf = tmp_path / "myconf"
    (conf / "data").mkdir(parents=True)
    (conf / "data" / "mine.yaml").write_text("name: synthetic\nnum_samples: 48\nseed: 3\n")
    args = [f.format(d=conf) for f in flag]
    r = cli([*args, "data=mine", "device=cpu", "dry_run=true"], out_root)
    assert r.returncode == 0, r.stderr
    assert "num_samples: 48" not in r.stderr


def test_hydra_searchpath_adds_groups_too(out_root, tmp_path, cli):
    conf = tmp_path / "extra"
    (conf / "data").mkdir(parents=True)
    (conf / "data" / "mine.yaml").write_text("name: synthetic\nnum_samples: 48\nseed: 3\n")
    r = cli([f"hydra.searchpath=[file://{conf}]", "data=mine", "device=cpu", "dry_run=true"], out_root)
    assert r.returncode == 0, r.stderr


def test_refused_on_the_command_line_before_anything_starts(tmp_path, cli):
    from ddp_runner.contract import layout

    r = cli(["device=cpu", "fault.kind=hang", "fault.rank=2"], tmp_path / "out")
    assert r.returncode == layout.EXIT_REFUSED, r.stderr
    assert "fault.rank" in r.stderr and "use a rank from 0 to 1" in r.stderr
    assert not (tmp_path / "out").exists()
