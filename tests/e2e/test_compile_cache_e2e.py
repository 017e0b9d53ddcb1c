"""train.compile_scope=blocks (tasks/engine/strategy/ddp_compile.py), and the compile cache every run under one
output root shares (tasks/engine/compile_cache.py): in process with a recording backend, then through the CLI with
inductor on the CPU."""

from __future__ import annotations

import re

import pytest
from conftest import ddp_run, load_json, run_dirs

from ddp_runner.contract import layout


@pytest.mark.timeout(1500)  # two CPU compiles through the CLI (minutes on a busy 2-core machine)
def test_a_second_run_under_the_same_root_hits_the_first_runs_compile_cache(tmp_path, monkeypatch):
    for var in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):  # set by inductor in this process, maybe
        monkeypatch.delenv(var, raising=False)
    root = tmp_path / "outputs"
    args = ["task=gpt", "task.model.layers=1", "world_size=1", "device=cpu", "train.compile=true",
            "train.compile_scope=blocks", "train.max_steps=3", "train.val_every=0", "data.val_fraction=0.0",
            "checkpoint.async_save=false"]
    first = ddp_run(args, root, timeout=600)
    assert first.returncode == 0, first.stdout + first.stderr
    cache = root / layout.COMPILE_CACHE
    assert any(p.is_file() for p in cache.rglob("*")), "the first run filled the root's compile cache"
    second = ddp_run(args, root, timeout=600)
    assert second.returncode == 0, second.stdout + second.stderr
    runs = run_dirs(root)  # <date>/<HH-MM-SS>_…: in the order they ran
    s1, s2 = (load_json(r / "summary.json") for r in runs)
    assert s1["compile"]["scope"] == "blocks" and s1["compile"]["cache_dir"] == str(cache)
    assert s1["compile"]["cache_misses"] > 0
    assert s2["compile"]["cache_hits"] > 0 and s2["compile"]["cache_misses"] == 0, s2["compile"]
    # Where each compile's time went, by torch's own phase timers: the cold one spent longer compiling.
    cold, warm = s1["compile"]["seconds"], s2["compile"]["seconds"]
    assert cold and all(v >= 0 for v in cold.values()), cold
    assert cold["_compile.compile_inner"] > warm["_compile.compile_inner"] > 0, (cold, warm)
    assert "hits" in (runs[-1] / "logs" / "rank0.log").read_text()


@pytest.mark.timeout(1500)
def test_the_two_rank_job_of_a_sweep_hits_every_entry_of_the_one_rank_jobs_cache(tmp_path, monkeypatch):
    # The whole model in one graph (no split): compiled in place, the 1-rank model and the DDP-wrapped 2-rank one
    # trace the same graph, so the second job reuses the first's inductor graphs and its AOTAutograd entry too.
    for var in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
        monkeypatch.delenv(var, raising=False)
    root = tmp_path / "outputs"
    args = ["task=gpt", "task.model.layers=1", "device=cpu", "batch.global=16", "batch.per_rank=4",
            "train.compile=true", "train.ddp_split_graph=false", "train.max_steps=2", "train.val_every=0",
            "data.val_fraction=0.002", "checkpoint.async_save=false"]
    for w in (1, 2):
        r = ddp_run([*args, f"world_size={w}"], root, timeout=600)
        assert r.returncode == 0, r.stdout + r.stderr
    # The training step's graphs, as each job's first step reports them (the final validation compiles graphs
    # of its own, whose last batch differs in size between the world sizes).
    first = [re.search(r"compile: first step .*: (\d+) hits, (\d+) misses", (r / "logs" / "rank0.log").read_text())
             for r in run_dirs(root)]
    (hits1, misses1), (hits2, misses2) = ((int(m.group(1)), int(m.group(2))) for m in first)
    assert hits1 == 0 and misses1 >= 2, "forward and backward (inductor) and the AOTAutograd entry"
    assert (hits2, misses2) == (misses1, 0)
    s2 = load_json(run_dirs(root)[1] / "summary.json")["compile"]
    assert s2["autograd_hit"] >= 1, s2
