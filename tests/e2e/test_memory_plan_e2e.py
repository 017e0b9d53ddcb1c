"""The memory planner's arithmetic (pure: no torch, no processes) and its refusal through the real CLI."""

from __future__ import annotations

import re

import pytest

from tests.support.driver import ddp_run
from tests.support.run_tree import load_json, run_dirs

# 4 blocks: the fewest at which FSDP's estimate, with the planner's 15% to spare, fits below the midpoint of FSDP's
# and ZeRO-1's (at 2, FSDP's unsharded block and activations make it too close to ZeRO-1's). 8 validation samples:
# the end-of-run validation under FSDP all-gathers every block for each batch: 8 samples, not the preset's default.
TINY = ["task=gpt", "device=cpu", "world_size=2", "task.model.layers=4", "task.model.width=128",
        "task.model.context=16", "batch.per_rank=2", "checkpoint.async_save=false", "train.val_every=0",
        "train.val_samples=8", "data.val_fraction=0.01"]


@pytest.mark.timeout(600)  # five CLI calls, three of them training runs
def test_planner_refuses_over_the_cap_and_its_suggestion_trains_checkpoints_and_resumes(tmp_path, cli):
    # The dry run and the refusal through the CLI's main() in this process; the runs through python -m runner.
    r = cli([*TINY, "strategy.memory_cap_gb=1", "dry_run=true"], tmp_path / "dry")
    assert r.returncode == 0, r.stdout + r.stderr
    totals = {s: float(v) for s, v in re.findall(r"(zero1|fsdp) ([\d.e-]+)", r.stdout)}
    cap = (totals["fsdp"] + totals["zero1"]) / 2  # DDP and ZeRO-1 do not fit, FSDP does

    r = cli([*TINY, f"strategy.memory_cap_gb={cap}"], tmp_path / "refused")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "refused: strategy='ddp': needs ~" in r.stderr and "GiB per rank" in r.stderr
    fix = re.search(r"fix:\s+use (strategy=\w+)", r.stderr)
    assert fix and fix.group(1) == "strategy=fsdp", r.stderr
    assert not (tmp_path / "refused").exists()

    args = [*TINY, fix.group(1), f"strategy.memory_cap_gb={cap}", "train.max_steps=4", "checkpoint.every_steps=2"]
    r = ddp_run([*args, "fault.kind=sigkill", "fault.rank=1", "fault.step=3"], tmp_path / "ok")
    assert r.returncode != 0
    [run] = run_dirs(tmp_path / "ok")
    memory = load_json(run / "run.json")["memory_plan"]
    assert memory["strategy"] == "fsdp" and memory["cap_gb"] == pytest.approx(cap)
    assert memory["estimates"]["fsdp"]["total_gb"] <= cap < memory["estimates"]["ddp"]["total_gb"]
    r = ddp_run([f"resume={run}"], tmp_path / "unused")
    assert r.returncode == 0, r.stdout + r.stderr
    summary = load_json(run / "summary.json")
    assert summary["steps"] == 4 and summary["resumed_from"].endswith("step_2")
