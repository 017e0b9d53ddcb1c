"""The driver's torch probe (runner/config/probe.py): one subprocess, its answer cached under the output root for the
next job with the same task and model, and nothing written for a refused plan or a dry run."""

from __future__ import annotations

import json
import os
import re
import time

from conftest import ddp_run, run_dirs

from runner.config import probe as probe_mod

# The smoke task computes no memory_facts of its own: torch's probe counts its model.
TINY = ["task=smoke", "device=cpu", "world_size=1", "train.max_steps=1", "strategy.memory_cap_gb=100",
        "checkpoint.final=false"]


def _params(stdout: str) -> int:
    """The parameter count a dry run's plan printout records."""
    return int(re.search(r"^  params: (\d+)$", stdout, re.M).group(1))


def test_the_answer_is_cached_for_the_next_job_and_read_from_there(tmp_path):
    root = tmp_path / "out"
    r = ddp_run([*TINY, "dry_run=true"], root)
    assert r.returncode == 0, r.stdout + r.stderr
    assert not root.exists(), "a dry run writes nothing under the output root"

    r = ddp_run(TINY, root)
    assert r.returncode == 0, r.stdout + r.stderr
    [cached] = list((root / ".compile_cache" / probe_mod.CACHE_SUBDIR).glob("*.json"))
    answer = json.loads(cached.read_text())
    assert answer["model"]["params"] > 0
    [run] = run_dirs(root)
    first = json.loads((run / "run.json").read_text())["memory_plan"]["params"]
    assert first == answer["model"]["params"] == 9

    # The next job reads the cache instead of probing: a doctored count shows in its plan.
    answer["model"]["params"] *= 2
    cached.write_text(json.dumps(answer))
    r = ddp_run([*TINY, "dry_run=true"], root)
    assert r.returncode == 0, r.stdout + r.stderr
    assert _params(r.stdout) == 2 * first

    # Another model is another key: probed afresh, and cached beside the first.
    r = ddp_run([*TINY, "task.in_features=16"], root)
    assert r.returncode == 0, r.stdout + r.stderr
    assert len(list((root / ".compile_cache" / probe_mod.CACHE_SUBDIR).glob("*.json"))) == 2
    assert len(run_dirs(root)) == 2


def test_a_refused_plan_writes_nothing(tmp_path):
    r = ddp_run(["task=gpt", "device=cpu", "world_size=1", "strategy.memory_cap_gb=0.001"], tmp_path / "out")
    assert r.returncode == 2, r.stdout + r.stderr
    assert not (tmp_path / "out").exists()


def test_the_key_follows_the_model_config_torch_and_the_sources(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    src = tmp_path / "my_task_for_probe.py"
    src.write_text("X = 1\n")
    cfg = {"task": {"module": "my_task_for_probe", "width": 8}, "data": {"name": "synthetic"}, "train": {}}
    key = probe_mod.cache_key(cfg, ["model"], str(tmp_path))
    assert probe_mod.cache_key(cfg, ["model"], str(tmp_path)) == key
    assert probe_mod.cache_key({**cfg, "task": {**cfg["task"], "width": 16}}, ["model"], str(tmp_path)) != key
    assert probe_mod.cache_key(cfg, ["model", "inductor"], str(tmp_path)) != key
    assert probe_mod.cache_key({**cfg, "world_size": 4, "train": {"lr": 1.0}}, ["model"], str(tmp_path)) == key
    later = time.time() + 5
    os.utime(src, (later, later))  # the task's source edited
    assert probe_mod.cache_key(cfg, ["model"], str(tmp_path)) != key
    monkeypatch.setattr(probe_mod, "_torch_version", lambda: "0.0.0")
    os.utime(src, (later, later))
    assert probe_mod.cache_key(cfg, ["model"], str(tmp_path)) != key


def test_gpt_counts_its_parameters_as_the_model_built_on_the_meta_device_does():
    from tasks.engine.config import Config
    from tasks.engine.driver_probe import model_facts
    from tasks.gpt import checks

    base = {"task": {"name": "gpt", "module": "tasks.gpt.task", "model": {"layers": 2, "heads": 2, "width": 64,
                                                                         "context": 64, "vocab": 256}},
            "data": {"name": "text", "path": None, "val_fraction": 0.1}, "seed": 0}
    for shape in ({}, {"layers": 3, "width": 96, "heads": 4, "vocab": 300, "context": 32},
                  {"layers": 12, "heads": 12, "width": 768, "context": 1024, "vocab": 50304}):
        cfg = {**base, "task": {**base["task"], "model": {**base["task"]["model"], **shape}}}
        probed = model_facts(Config(cfg))
        assert checks.memory_facts(cfg) == {**probed, "arch": {**probed["arch"], "loss": "fused"}}, shape


def test_inductor_settings_read_from_source_are_torchs_own():
    import torch._inductor.config as inductor_config

    from runner.config import inductor_settings

    real = inductor_config.get_config_copy()
    static = inductor_settings.settings()
    assert set(real) - set(static) <= {"TYPE_CHECKING"}  # imported from typing, not a setting anyone sets
    # Extra names are aliases (Config(alias=...)), settable but not copied by get_config_copy.
    assert len(set(static) - set(real)) < 10
    for key, kind in static.items():
        if kind is inductor_settings.BOOL and key in real:
            assert isinstance(real[key], bool) or real[key] is None, key  # booleans, or unset tristates
    assert static["triton.cudagraphs"] is inductor_settings.BOOL and "triton.mix_order_reduction" in static


def test_the_driver_answers_gpt_and_inductor_questions_without_a_subprocess(tmp_path):
    from runner.job import planning

    cfg = {"task": {"name": "gpt", "module": "tasks.gpt.task", "checks": "tasks.gpt.checks",
                    "model": {"layers": 2, "heads": 2, "width": 64, "context": 64, "vocab": 256}},
           "data": {"name": "text"}, "device": "cpu", "strategy": {"memory_cap_gb": 1},
           "train": {"inductor": {"triton": {"cudagraphs": False}}}, "output": {"root": str(tmp_path)}}
    probe = planning.start_probe(cfg, None)
    assert probe.proc is None and set(probe.result()) == {"model", "inductor"}
    assert probe.result()["inductor"] == {"triton.cudagraphs": True}  # a boolean setting (its placeholder)
    smoke = {**cfg, "task": {"name": "smoke", "module": "tasks.smoke", "checks": "tasks.smoke_checks",
                             "in_features": 8, "out_features": 1}, "data": {"name": "synthetic", "num_samples": 8,
                                                                            "seed": 0}}
    probe = planning.start_probe(smoke, None)
    assert probe.proc is not None, "the smoke task has no memory_facts: torch counts its model"
    assert probe.result()["model"]["params"] == 9


def test_a_plan_refused_after_the_probe_started_leaves_no_probe_running(tmp_path):
    import psutil

    # The probe starts (the smoke task has no memory_facts), then the watchdog setting is refused.
    r = ddp_run(["task=smoke", "device=cpu", "strategy.memory_cap_gb=100", "timeout_s=60", "watchdog.timeout_s=90"],
                tmp_path / "out")
    assert r.returncode == 2 and "watchdog.timeout_s" in r.stderr, r.stdout + r.stderr
    assert not (tmp_path / "out").exists()
    probes = [p for p in psutil.process_iter(["cmdline"]) if "tasks.engine.driver_probe" in (p.info["cmdline"] or [])]
    assert probes == []
