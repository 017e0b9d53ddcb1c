"""The compile cache every run under one output root shares (tasks/engine/compile_cache.py), through the CLI with
inductor on the CPU: a sweep's 2-rank job hits every entry its 1-rank job compiled. (train.compile_scope=blocks
is checked in process with a recording backend: tests/unit/test_compile_scope.py.)

The smoke task's Linear and MSE loss: a forward and a backward graph of a few C++ kernels (each kernel a C++
compile of up to seconds of CPU; the 1-layer GPT's graphs have several times as many)."""

from __future__ import annotations

import re

import pytest

from ddp_runner.contract import layout
from tests.support.driver import ddp_run
from tests.support.run_tree import load_json, run_dirs


@pytest.mark.timeout(1500)  # two CPU compiles through the CLI (minutes on a busy 2-core machine)
def test_the_two_rank_job_of_a_sweep_hits_every_entry_of_the_one_rank_jobs_cache(tmp_path, monkeypatch):
    # The whole model in one graph (no split): compiled in place, the 1-rank model and the DDP-wrapped 2-rank one
    # trace the same graph, so the second job reuses every inductor graph the first compiled.
    for var in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):  # set by inductor in this process, maybe
        monkeypatch.delenv(var, raising=False)
    root = tmp_path / "outputs"
    args = ["task=smoke", "device=cpu", "batch.global=16", "batch.per_rank=4", "train.compile=true",
            "train.ddp_split_graph=false", "train.max_steps=2", "train.val_every=0", "checkpoint.async_save=false"]
    cache = root / layout.COMPILE_CACHE
    for w in (1, 2):
        r = ddp_run([*args, f"world_size={w}"], root, timeout=600)
        assert r.returncode == 0, r.stdout + r.stderr
        if w == 1:
            assert any(p.is_file() for p in cache.rglob("*")), "the first job filled the root's compile cache"
    runs = run_dirs(root)  # <date>/<HH-MM-SS>_…: in the order they ran
    # The training step's graphs, as each job's first step reports them (the final validation runs eagerly:
    # train.val_compile=auto with no periodic validation).
    first = [re.search(r"compile: first step .*: (\d+) hits, (\d+) misses", (r / "logs" / "rank0.log").read_text())
             for r in runs]
    (hits1, misses1), (hits2, misses2) = ((int(m.group(1)), int(m.group(2))) for m in first)
    assert hits1 == 0 and misses1 >= 2, "forward and backward (inductor)"
    assert (hits2, misses2) == (misses1, 0)
    s1, s2 = (load_json(r / "summary.json")["compile"] for r in runs)
    assert s1["scope"] == "model" and s1["cache_dir"] == s2["cache_dir"] == str(cache)
    assert s1["cache_misses"] > 0 and s2["cache_hits"] > 0 and s2["cache_misses"] == 0, (s1, s2)
    # Where each compile's time went, by torch's own phase timers: the cold one spent longer compiling.
    cold, warm = s1["seconds"], s2["seconds"]
    assert cold and all(v >= 0 for v in cold.values()), cold
    assert cold["_compile.compile_inner"] > warm["_compile.compile_inner"] > 0, (cold, warm)
