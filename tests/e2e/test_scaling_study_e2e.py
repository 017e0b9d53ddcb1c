"""bench/scaling_study.py, the GPU study script, dry-run on the CPU with the tiny GPT and a stand-in reference."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


# Prints the reference's JSON line, as gpt_ddp_reference.py does on rank 0.
STUB_REFERENCE = """
import json, os, time
if os.environ.get("RANK", "0") == "0":
    print(json.dumps({"world": int(os.environ["WORLD_SIZE"]), "tok_s": 1000, "step_s": 0.5, "mfu_vs_989": 0.4,
                      "launch_to_first_step_s": round(time.time() - float(os.environ["T0"]), 1), "mem_gb": 1.0}))
"""


def test_dry_run_on_cpu_runs_every_part_and_writes_the_report(tmp_path):
    ref = tmp_path / "ref.py"
    ref.write_text(STUB_REFERENCE)
    out = tmp_path / "study"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "scaling_study.py"), "--device", "cpu", "--task", "gpt",
         "--global-batch", "16", "--per-rank", "8", "--steps", "4", "--pair-steps", "6", "--scopes", "model",
         "--reference", str(ref), "--set", "train.compile=false", "--set", "data.val_fraction=0.002",
         "--doctor-sizes", "1M",  # ddp-doctor's own measurement is tested at its default sizes (test_doctor_host.py)
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
