"""bench/scaling_study.py, the GPU study script, dry-run on the CPU with the tiny GPT and a stand-in reference."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import scaling_study  # noqa: E402

# Prints the reference's JSON line, as gpt_ddp_reference.py does on rank 0.
STUB_REFERENCE = """
import json, os, time
if os.environ.get("RANK", "0") == "0":
    print(json.dumps({"world": int(os.environ["WORLD_SIZE"]), "tok_s": 1000, "step_s": 0.5, "mfu_vs_989": 0.4,
                      "launch_to_first_step_s": round(time.time() - float(os.environ["T0"]), 1), "mem_gb": 1.0}))
"""


def test_summary_states_the_goals_against_the_reference():
    job = {"values": {"world_size": "1"}, "status": "completed", "tok_s": 900.0, "cache_hits": 0,
           "time_breakdown": {"shares": {"data": 0.0, "compute": 0.9, "exposed_sync": 0.05, "optimizer": 0.05},
                              "gap_pct": 2.0}}
    res = {"reference": [{"world": 1, "first_step_s": 40.0, "tok_s": 1000.0, "step_s": 0.5, "rc": 0}],
           "studies": [{"scope": "blocks", "rc": 0, "wall_s": 90.0, "sweep_dir": "s",
                        "jobs": [{**job, "job": 0, "first_step_s": 30.0},
                                 {**job, "job": 1, "first_step_s": 12.0, "values": {"world_size": "2"}}]}],
           "pairs": [{"name": "d", "a": {"overrides": ["x=0"], "tok_s": 100.0}, "b": {"overrides": ["x=5"],
                                                                                       "tok_s": 99.0},
                      "b_over_a_pct": -1.0}], "wall_s": 100.0}
    text = "\n".join(scaling_study.summary_lines(res))
    assert "job 1 30.0 s vs reference w1 40.0 s: MET" in text and "job 2 12.0 s = 40% of job 1: MET" in text
    assert "w1 tokens/s against the reference: 90.0%" in text and "second/first -1.00%" in text
    assert "exposed sync 5.0%" in text


@pytest.mark.slow
def test_dry_run_on_cpu_runs_every_part_and_writes_the_report(tmp_path):
    ref = tmp_path / "ref.py"
    ref.write_text(STUB_REFERENCE)
    out = tmp_path / "study"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "scaling_study.py"), "--device", "cpu", "--task", "gpt",
         "--global-batch", "16", "--per-rank", "8", "--steps", "4", "--pair-steps", "6", "--scopes", "model",
         "--reference", str(ref), "--set", "train.compile=false", "--set", "data.val_fraction=0.002",
         "--out", str(out)], capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    res = json.loads((out / "results.json").read_text())
    assert [r["world"] for r in res["reference"]] == [1, 2] and all(r["tok_s"] == 1000 for r in res["reference"])
    [study] = res["studies"]
    assert [j["status"] for j in study["jobs"]] == ["completed", "completed"]
    assert all(j["first_step_s"] > 0 and j["time_breakdown"] for j in study["jobs"])
    assert (out / "compare-model" / "report.md").is_file() and (out / "compare-model" / "throughput.png").is_file()
    d, e = res["pairs"]
    assert d["b"]["overrides"] == ["checkpoint.every_steps=5", "train.val_every=5"] and d["b_over_a_pct"] is not None
    assert d["b"]["goodput_shares"]["checkpoint"] > 0
    assert e["a"]["time_breakdown"] is None and e["b"]["time_breakdown"]["per_rank"].keys() == {"0", "1"}
    assert "SCALING STUDY SUMMARY" in proc.stdout and "goals: job 1" in proc.stdout
    assert res["doctor"]["rc"] == 0, res["doctor"]
    doctor = json.loads((out / "doctor.json").read_text())  # the host's report beside the study
    assert {c["name"]: c["status"] for c in doctor["checks"]}["bandwidth"] == "ok", doctor


def test_the_strategy_bench_states_scaling_per_strategy_and_for_the_best():
    """bench/strategy_bench.py compares each strategy at N GPUs with itself on one GPU, and the best at N with the
    best on one; worlds without a 1-GPU run get no line."""
    import strategy_bench

    rows = [{"run": "gpt2_small", "strategy": s, "world": w, "tok_s": t}
            for s, w, t in (("ddp", 1, 500.0), ("fsdp", 1, 400.0), ("ddp", 2, 960.0), ("fsdp", 2, 800.0),
                            ("ddp", 4, 1800.0))]
    rows.append({"run": "gpt_6b", "strategy": "fsdp", "world": 2, "tok_s": 10.0})
    assert strategy_bench.scaling_lines(rows) == [
        "GPT-2 small scaling 1 → 2 GPUs, best strategy ddp against the best on 1 GPU: 96.0%"
        " (each against itself: ddp 96.0%, fsdp 100.0%)",
        "GPT-2 small scaling 1 → 4 GPUs, best strategy ddp against the best on 1 GPU: 90.0%"
        " (each against itself: ddp 90.0%)"]
    assert strategy_bench.scaling_lines([r for r in rows if r["world"] != 1]) == []
