"""The driver's torch probe (runner/config/probe.py): one subprocess, its answer cached under the output root for the
next job with the same task and model, and nothing written for a refused plan or a dry run."""

from __future__ import annotations

import importlib.util
import os
import time

from ddp_runner.config import probe as probe_mod


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



def test_the_key_follows_the_probe_the_engine_and_the_built_in_tasks():
    """Every source file of the worker package (tasks/, installed as ddp_runner.tasks) is in the key: an edited
    engine or built-in model is probed again."""
    sources = probe_mod._sources(None, None)
    assert importlib.util.find_spec("ddp_runner.tasks.engine.driver_probe").origin in sources
    assert any(s.endswith(os.path.join("tasks", "gpt", "model.py")) for s in sources)

def test_gpt_counts_its_parameters_as_the_model_built_on_the_meta_device_does():
    from ddp_runner.tasks.engine.config import Config
    from ddp_runner.tasks.engine.driver_probe import model_facts
    from ddp_runner.tasks.gpt import checks

    base = {"task": {"name": "gpt", "module": "ddp_runner.tasks.gpt.task", "model": {"layers": 2, "heads": 2,
                                                                                     "width": 64,
                                                                         "context": 64, "vocab": 256}},
            "data": {"name": "text", "path": None, "val_fraction": 0.1}, "seed": 0}
    for shape in ({}, {"layers": 3, "width": 96, "heads": 4, "vocab": 300, "context": 32},
                  {"layers": 12, "heads": 12, "width": 768, "context": 1024, "vocab": 50304}):
        cfg = {**base, "task": {**base["task"], "model": {**base["task"]["model"], **shape}}}
        probed = model_facts(Config(cfg))
        assert checks.memory_facts(cfg) == {**probed, "arch": {**probed["arch"], "loss": "fused"}}, shape


def test_inductor_settings_read_from_source_are_torchs_own():
    import torch._inductor.config as inductor_config

    from ddp_runner.config import inductor_settings

    real = inductor_config.get_config_copy()
    static = inductor_settings.settings()
    assert set(real) - set(static) <= {"TYPE_CHECKING"}  # imported from typing, not a setting anyone sets
    # Extra names are aliases (Config(alias=...)), settable but not copied by get_config_copy.
    assert len(set(static) - set(real)) < 10
    for key, kind in static.items():
        if kind is inductor_settings.BOOL and key in real:
            assert isinstance(real[key], bool) or real[key] is None, key  # booleans, or unset tristates
    assert static["triton.cudagraphs"] is inductor_settings.BOOL and "triton.mix_order_reduction" in static
