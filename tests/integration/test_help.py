"""What ``ddp-run`` answers without running anything: ``--help``, ``--info``, ``--cfg job``, the dry run's
command, and the docs (the config reference page is not stale; the site builds with ``mkdocs build --strict``)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

from ddp_runner.config import reference
from ddp_runner.config.cli_help import compose_values, conf_dirs
from ddp_runner.config.key_docs import KEY_DOCS
from ddp_runner.contract import layout
from tests.support.run_tree import run_dirs

ROOT = Path(__file__).resolve().parents[2]


def test_help_covers_every_key_of_the_validation_table_and_every_preset(out_root, cli) -> None:
    r = cli(["--help"], out_root)
    assert r.returncode == 0, r.stderr
    for rule in reference.table_rules():
        assert f"{reference.kind(rule)}: {reference.allowed(rule)}. {KEY_DOCS[rule.key]}" in r.stdout, rule.key
        assert f"\n  {rule.key}" in r.stdout, rule.key
    for options in reference.presets(conf_dirs(None)).values():
        for name in options:
            assert f"\n    {name} " in r.stdout, name
    assert "The seed's DDP smoke test" in r.stdout and "install=bash" in r.stdout
    assert not out_root.exists()


def test_help_shows_the_values_of_the_config_the_overrides_compose(out_root, cli) -> None:
    r = cli(["task=gpt", "batch.per_rank=3", "--help"], out_root)
    assert r.returncode == 0, r.stderr
    assert "\n  batch.per_rank = 3\n" in r.stdout and "\n  train.optimizer = adamw\n" in r.stdout
    assert "\n  task.model.layers = 2" in r.stdout  # the task's own keys, under "Other keys"


def test_help_for_named_keys_prints_only_their_lines(out_root, cli) -> None:
    """``--help KEY`` (before or after the flag) prints that key's lines; a group (``train``, ``task``) its keys and
    presets; a name that is neither is refused with the nearest names."""
    for args in (["train.lr", "--help"], ["--help", "train.lr"]):
        r = cli(args, out_root)
        assert r.returncode == 0, r.stderr
        assert r.stdout.splitlines() == ["  train.lr = 0.01", "      float: > 0. peak learning rate"], r.stdout
    r = cli(["--help", "train", "batch.global"], out_root)
    keys = [ln.split(" = ")[0].strip() for ln in r.stdout.splitlines() if not ln.startswith("      ")]
    assert keys[0] == "train.max_steps" and "train.profile.start" in keys and keys[-1] == "batch.global", keys
    assert all(k.startswith("train.") for k in keys[:-1]) and "Presets" not in r.stdout
    r = cli(["--help", "task", "task=gpt"], out_root)
    assert "  task (pick one with task=option):" in r.stdout and "\n    gpt2_small " in r.stdout
    assert "\n    task.model.layers = 2" in r.stdout and "train.lr" not in r.stdout
    r = cli(["--help", "trian.lr"], out_root)
    assert r.returncode == 2 and "--help trian.lr: no key or group of that name (did you mean train.lr" in r.stderr
    assert not out_root.exists()


def test_help_shows_the_values_the_chosen_task_would_use(out_root, cli) -> None:
    """``task.module=x`` alone runs the custom preset (adamw, lr 3e-4 from config.yaml): the help shows its values,
    not the default task's (smoke: sgd, lr 0.01)."""
    r = cli(["task.module=mytask", "--help"], out_root)
    assert r.returncode == 0, r.stderr
    assert "\n  train.optimizer = adamw\n" in r.stdout and "\n  train.lr = 0.0003\n" in r.stdout
    assert "\n  task.module = mytask" in r.stdout and "in_features" not in r.stdout  # none of smoke's keys
    r = cli(["--help", "train.optimizer", "task.module=mytask", "task=smoke"], out_root)  # a preset named: its values
    assert "train.optimizer = sgd" in r.stdout


def test_help_with_overrides_that_do_not_compose_still_lists_every_key(out_root, cli) -> None:
    r = cli(["batch.perrank=3", "--help"], out_root)
    assert r.returncode == 0, r.stderr
    assert "\n  batch.per_rank\n" in r.stdout and "cannot be composed, so no values are shown" in r.stdout


def test_help_lists_a_users_own_presets(out_root, cli, tmp_path: Path) -> None:
    conf = tmp_path / "conf"
    (conf / "task").mkdir(parents=True)
    (conf / "task" / "mine.yaml").write_text("# @package _global_\n# My own classifier.\ntask:\n  name: mine\n")
    r = cli(["--config-dir", str(conf), "--help"], out_root)
    assert r.returncode == 0, r.stderr
    assert "mine                 My own classifier." in r.stdout


def test_info_works_after_the_runners_own_overrides(out_root, cli) -> None:
    r = cli(["--info"], out_root)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Defaults List" in r.stdout and "Config search path" in r.stdout
    r = cli(["--info", "defaults", "task=gpt"], out_root)
    assert r.returncode == 0 and "task/gpt" in r.stdout, r.stdout + r.stderr
    assert run_dirs(out_root.parent) == []


def test_cfg_job_says_what_the_runner_derives(out_root, cli) -> None:
    r = cli(["--cfg", "job", "batch.global=32", "device=cpu"], out_root)
    assert r.returncode == 0, r.stderr
    composed, derived = r.stdout.split("# ddp-run derives these after composition")
    assert "accumulation: 1" in composed  # Hydra's composition, as it is
    assert "#   batch.accumulation: 2   (batch.global 32 / (8 per rank × 2 ranks); global batch 32)" in derived
    assert "#   device:" not in derived and "#   backend: gloo" in derived  # device=cpu: used as it is
    assert "ddp-run batch.global=32 device=cpu" in derived and "dry_run=true" in derived
    r = cli(["--cfg", "job", "batch.global=30"], out_root)
    assert "batch.global 30 is not divisible by 8 per rank × 2 ranks, so the run is refused" in r.stdout
    assert not out_root.exists()


def test_the_dry_run_prints_the_command_that_launches_its_plan(out_root, cli) -> None:
    r = cli(["task=smoke", "device=cpu", "dry_run=true", "batch.per_rank=4"], out_root)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    launch = lines[lines.index("ddp-run: dry run, nothing launched. To launch this plan, run:") + 1].strip()
    assert shlex.split(launch) == ["ddp-run", "task=smoke", "device=cpu", "batch.per_rank=4",
                                   f"output.root={out_root}"]
    started = next(ln for ln in lines if "-m ddp_runner.tasks" in ln)
    assert _shell_words(started)[-1] == "/runs/a b" and "<run dir>" not in r.stdout
    assert not out_root.exists()


def test_the_dry_runs_torchrun_line_carries_its_environment_and_needs_run_dir(out_root, cli) -> None:
    """Pasted into a shell, the line ddp-run starts gets the variables ddp-run gives torchrun (the run directory's
    among them); with RUN_DIR unset, the shell refuses it in one line and starts nothing (it used to start
    torchrun, whose ranks each died with ``KeyError: 'DDP_RUNNER_RUN_DIR'``)."""
    r = cli(["task=smoke", "device=cpu", "dry_run=true"], out_root)
    assert r.returncode == 0, r.stderr
    assert "and starts, with the environment it gives torchrun:" in r.stdout
    started = next(ln for ln in r.stdout.splitlines() if "-m ddp_runner.tasks" in ln)
    words = _shell_words(started)
    assert words[0] == "env" and words[1:3] == [f"{layout.ENV_RUN_DIR}=/runs/a b", f"{layout.ENV_LOCAL_DIR}=/runs/a b"]
    assert words[-1] == "/runs/a b" and not any(w.startswith(layout.ENV_T0 + "=") for w in words)
    unset = subprocess.run(["bash", "-c", f'printf "%s\\n" {started.strip()}'], capture_output=True, text=True,
                           timeout=30, env={k: v for k, v in os.environ.items() if k != "RUN_DIR"})
    assert unset.returncode != 0 and unset.stdout == "", unset
    [line] = unset.stderr.strip().splitlines()
    assert "RUN_DIR: set RUN_DIR to a run directory ddp-run made" in line


def test_a_dry_run_sweep_prints_the_sweep_command_and_leaves_nothing(out_root, cli) -> None:
    r = cli(["-m", "device=cpu", "world_size=1,2", "dry_run=true"], out_root)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("To launch this sweep, run:\n  ddp-run -m device=cpu world_size=1,2 output.root=") == 2
    assert not out_root.exists(), "a dry run (a sweep's too) leaves no directory"


def test_the_slurm_dry_run_leaves_only_the_run_directory_to_the_shell(out_root, cli) -> None:
    r = cli(["task=smoke", "device=cpu", "launcher=slurm", "launcher.nodes=2", "dry_run=true"], out_root)
    assert r.returncode == 0, r.stderr
    words = _shell_words(next(ln for ln in r.stdout.splitlines() if ln.strip().startswith("srun ")))
    assert "--error=/runs/a b/logs/torchrun.node%n.log" in words and words[-1] == "/runs/a b"
    assert "--rdzv-id=slurm-$SLURM_JOB_ID" in words  # the job's own variables are the sbatch script's to expand


def _shell_words(line: str) -> list[str]:
    """The words a shell makes of a printed command, with RUN_DIR set (a path with a space)."""
    r = subprocess.run(["bash", "-c", f'printf "%s\\n" {line.strip()}'], env={**os.environ, "RUN_DIR": "/runs/a b"},
                       capture_output=True, text=True, timeout=30, check=True)
    return r.stdout.splitlines()


def test_the_config_reference_page_is_up_to_date() -> None:
    page = (ROOT / "docs" / "config.md").read_text()
    assert page == reference.markdown(conf_dirs(None), compose_values([])), (
        "docs/config.md is stale: python -m ddp_runner.config.reference > docs/config.md")


def test_the_docs_site_builds_strictly(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-f", str(ROOT / "mkdocs.yml"),
                        "-d", str(tmp_path / "site")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (tmp_path / "site" / "config" / "index.html").exists()
    nav = (ROOT / "mkdocs.yml").read_text()
    for page in (ROOT / "docs").glob("*.md"):  # every page is in the nav (strict mode only warns of it otherwise)
        assert f": {page.name}" in nav, page.name
