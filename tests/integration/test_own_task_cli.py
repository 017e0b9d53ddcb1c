"""A task of the user's own through ddp-run's main() in process: a module alone composes the neutral preset
(its own name, none of smoke's keys or checks), and an unknown task is refused with both ways named."""

from __future__ import annotations

USER_TASK = "import torch\n\n\ndef build(cfg, device):\n    raise NotImplementedError\n"


def test_a_module_alone_is_its_own_task(out_root, tmp_path, monkeypatch, cli):
    (tmp_path / "mytask.py").write_text(USER_TASK)
    monkeypatch.syspath_prepend(str(tmp_path))
    r = cli(["task.module=mytask", "device=cpu", "dry_run=true"], out_root)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("ddp-run: mytask: global batch 16 = 8 per rank × 2 ranks"), r.stdout
    # A data group of the user's own: smoke's checks (ddp_runner.tasks.smoke_checks) refuse it, a module alone has none.
    (tmp_path / "conf" / "data").mkdir(parents=True)
    (tmp_path / "conf" / "data" / "mine.yaml").write_text("name: mine\n")
    args = ["--config-dir", str(tmp_path / "conf"), "data=mine", "task.module=mytask", "device=cpu", "dry_run=true"]
    r = cli(args, out_root)
    assert r.returncode == 0, r.stderr
    r = cli([*args, "task=smoke"], out_root)
    assert r.returncode == 2 and "task=smoke makes its own random samples" in r.stderr, r.stderr
    assert not out_root.exists()


def test_a_task_file_alone_is_its_own_task(out_root, tmp_path, cli):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "mytask.py").write_text(USER_TASK)
    r = cli([f"task.module={tmp_path / 'elsewhere' / 'mytask.py'}", "device=cpu", "dry_run=true"], out_root)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("ddp-run: mytask: global batch 16"), r.stdout


def test_the_neutral_preset_holds_no_other_tasks_keys():
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from ddp_runner.cli import CONFIG_PATH
    from ddp_runner.config import reference
    from ddp_runner.config.task_module import register_resolver

    register_resolver()
    conf_dir = reference.conf_dirs(None, CONFIG_PATH)[0]
    with initialize_config_dir(config_dir=str(conf_dir), version_base=None):
        cfg = compose("config", ["task=custom", "task.module=mypkg.mytask"])
    task = OmegaConf.to_container(cfg, resolve=True)["task"]
    assert task == {"name": "mytask", "module": "mypkg.mytask", "checks": None}  # no in_features, no smoke checks


def test_a_module_without_build_or_none_at_all_is_refused(out_root, cli):
    r = cli(["task=custom", "device=cpu"], out_root)
    assert r.returncode == 2 and "key:   task.module" in r.stderr and "build(cfg, device)" in r.stderr, r.stderr
    assert not out_root.exists()


def test_an_unknown_task_is_refused_naming_both_ways_and_the_presets(out_root, cli):
    r = cli(["task=mytask", "device=cpu"], out_root)
    assert r.returncode == 2, r.stderr
    assert "no task/mytask.yaml in the config search path" in r.stderr
    assert "--config-dir <folder> task=mytask" in r.stderr and "task.module=" in r.stderr
    assert "built-in presets: gpt, gpt2_large" in r.stderr and "smoke" in r.stderr and ", custom" not in r.stderr
    assert not out_root.exists()


def test_a_task_yaml_in_the_config_dir_is_a_preset(out_root, tmp_path, monkeypatch, cli):
    (tmp_path / "mytask.py").write_text(USER_TASK)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "conf" / "task").mkdir(parents=True)
    (tmp_path / "conf" / "task" / "mytask.yaml").write_text(
        "# @package _global_\ntask:\n  name: mytask\n  module: mytask\n  width: 4\nbatch:\n  per_rank: 4\n")
    r = cli(["--config-dir", str(tmp_path / "conf"), "task=mytask", "task.width=8", "device=cpu", "dry_run=true"],
            out_root)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("ddp-run: mytask: global batch 8 = 4 per rank × 2 ranks"), r.stdout
