"""Nothing assumes two ranks: the tiny GPT task at 3 ranks with a kill and a bit-identical resume, and a 1-2-3-4
fixed-global-batch sweep (every rank of every job ran, logged and exited 0) read back by the compare report.
"""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ddp_run, load_json, run_dirs

# Validation on a sliver of the default corpus (its 10 % tail is ~19k windows: seconds per validation on a CPU).
GPT = ["task=gpt", "device=cpu", "checkpoint.async_save=false", "train.max_steps=8", "checkpoint.every_steps=2",
       "data.val_fraction=0.002"]


def _one(root: Path) -> Path:
    [run] = run_dirs(root)
    return run


# 3- and 4-rank runs that complete with every rank's exit code and log: the 1-2-3-4 sweep below (the smoke task at
# 3 and 4 ranks was a run of its own before; the sweep's tiny GPT jobs at 3 and 4 ranks assert the same).


def test_gpt_at_three_ranks_killed_on_the_last_rank_resumes_to_the_same_losses(tmp_path: Path) -> None:
    clean_root, crash_root = tmp_path / "clean", tmp_path / "crash"
    r = ddp_run([*GPT, "world_size=3"], clean_root)
    assert r.returncode == 0, r.stdout + r.stderr
    r = ddp_run([*GPT, "world_size=3", "fault.kind=sigkill", "fault.rank=2", "fault.step=5"], crash_root)
    assert r.returncode != 0, r.stdout + r.stderr
    crashed = _one(crash_root)
    assert load_json(crashed / "summary.json")["root_cause"]["rank"] == 2
    r = ddp_run([f"resume={crashed}"], tmp_path / "unused")
    assert r.returncode == 0, r.stdout + r.stderr
    resumed, clean = load_json(crashed / "summary.json"), load_json(_one(clean_root) / "summary.json")
    assert resumed["resumed_from"].endswith("checkpoints/step_4")
    assert len(resumed["losses"]) == len(clean["losses"]) == 8
    # Up to the resume and its first steps, bit for bit. Later steps may differ in the last bits: two
    # uninterrupted 3-rank runs agree exactly, but a launch's first DDP iteration reduces with the initial bucket
    # layout (rebuilt from the second one), and a sum over three ranks depends on the order (two ranks: a+b = b+a).
    assert resumed["losses"][:6] == clean["losses"][:6]
    assert resumed["losses"] == pytest.approx(clean["losses"], rel=1e-5)


def test_fixed_global_batch_sweep_over_one_to_four_ranks_and_its_report(tmp_path: Path) -> None:
    root = tmp_path / "outputs"
    common = ["task=gpt", "device=cpu", "train.max_steps=6", "batch.per_rank=2", "batch.global=24",
              "data.val_fraction=0.002"]
    r = ddp_run(["-m", "world_size=1,2,3,4", *common], root, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    runs = run_dirs(root)
    assert len(runs) == 4
    accum = {load_json(p / "run.json")["plan"]["world_size"]: load_json(p / "run.json")["plan"]["accumulation"]
             for p in runs}
    assert accum == {1: 12, 2: 6, 3: 4, 4: 3}
    for run in runs:  # nothing assumes two ranks: every rank of every job ran, logged and exited 0
        manifest, summary = load_json(run / "run.json"), load_json(run / "summary.json")
        world = manifest["plan"]["world_size"]
        assert manifest["plan"]["global_batch"] == 24 and summary["status"] == "completed"
        assert manifest["exit_codes"] == {str(r): 0 for r in range(world)}
        assert sorted(p.name for p in (run / "logs").glob("rank*.log")) == [f"rank{r}.log" for r in range(world)]
    (sweep,) = {p.parent for p in runs}
    out = tmp_path / "report"
    res = subprocess.run([sys.executable, "-m", "ddp_runner.report.compare", str(sweep), "--out", str(out)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    table = list(csv.DictReader((out / "report.csv").open()))
    assert sorted(int(row["world"]) for row in table) == [1, 2, 3, 4]
    base = next(row for row in table if row["world"] == "1")
    for row in table:
        assert row["status"] == "completed" and int(row["global_batch"]) == 24
        world = int(row["world"])
        assert float(row["efficiency"]) == pytest.approx(float(row["rate"]) / world / float(base["rate"]))
