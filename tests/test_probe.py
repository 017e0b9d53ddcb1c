"""The driver's torch probe (runner/probe.py): one subprocess, its answer cached under the output root for the
next job with the same task and model, and nothing written for a refused plan or a dry run."""

from __future__ import annotations

import json
import os
import re
import time

from conftest import ddp_run, run_dirs

from runner import probe as probe_mod

TINY = ["task=gpt", "device=cpu", "world_size=1", "batch.per_rank=2", "train.max_steps=1", "train.compile=false",
        "strategy.memory_cap_gb=100", "checkpoint.final=false"]


def _params(stdout: str) -> float:
    return float(re.search(r"parameters ([\d.e-]+)", stdout).group(1))


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
    first = _params(r.stdout)

    # The next job reads the cache instead of probing: a doctored count shows in its plan.
    answer["model"]["params"] *= 2
    cached.write_text(json.dumps(answer))
    r = ddp_run([*TINY, "dry_run=true"], root)
    assert r.returncode == 0, r.stdout + r.stderr
    assert _params(r.stdout) == 2 * first

    # Another model is another key: probed afresh, and cached beside the first.
    r = ddp_run([*TINY, "task.model.width=32"], root)
    assert r.returncode == 0, r.stdout + r.stderr
    assert len(list((root / ".compile_cache" / probe_mod.CACHE_SUBDIR).glob("*.json"))) == 2
    assert len(run_dirs(root)) == 2


def test_a_refused_plan_writes_nothing(tmp_path):
    r = ddp_run([*TINY, "strategy.memory_cap_gb=0.001"], tmp_path / "out")
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
