"""A new user's path through a plan that does not fit (issue 18, "done when"), on the GPUs of this host.

1. Runs ``python -m ddp_runner <overrides>``: a plan over its memory cap must be refused (exit 2) with no run directory.
2. Takes the fix the refusal names (``use strategy=…`` and, where given, ``batch.per_rank=…``/``batch.global=…``).
3. Runs the fixed plan uninterrupted (``--steps``, a checkpoint every ``--every`` steps) twice, then again with
   rank 0 SIGKILLed after step ``--kill``, and resumes that run in place (``resume=<run dir>``).
4. Reports the losses of the runs (equal or not, the largest difference; the second uninterrupted run is the
   yardstick for the resumed one where GPU kernels are not deterministic), the measured peak against the planned
   and the cap, and the share of the GPU the ranks were held to (``memory_fraction`` in ``logs/rank0.json``).

Usage: python bench/refused_plan.py --out refused.json --work /tmp/refused -- task=gpt2_medium world_size=1 \\
    batch.per_rank=16 strategy.memory_cap_gb=12
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
FIX = re.compile(r"fix:\s+use (strategy=\w+(?: strategy\.accumulate_unsharded=false)?)"
                 r"(?: with (batch\.per_rank=\d+) \(add (batch\.global=\d+))?")


def ddp_run(args: list[str], root: Path) -> tuple[subprocess.CompletedProcess[str], float]:
    """One ``ddp-run`` under ``root``; the process and its wall time."""
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "ddp_runner", *args, f"output.root={root}"], env={**os.environ, **ENV},
                          capture_output=True, text=True, timeout=1200)
    return proc, time.perf_counter() - t0


def run_dirs(root: Path) -> list[Path]:
    """Run directories under ``root`` (those with a run.json)."""
    return sorted(p.parent for p in root.glob("**/run.json")) if root.exists() else []


def fixed_args(overrides: list[str], stderr: str) -> list[str]:
    """The overrides with the refusal's fix applied (the fix's keys replace the user's)."""
    m = FIX.search(stderr)
    if not m:
        raise SystemExit(f"no fix found in the refusal:\n{stderr[-2000:]}")
    fix = [w for g in m.groups() if g for w in g.split()]
    keys = {f.split("=", 1)[0] for f in fix}
    return [o for o in overrides if o.split("=", 1)[0] not in keys] + fix


def report(run: Path) -> dict[str, Any]:
    """What a finished run says about itself."""
    summary = json.loads((run / "summary.json").read_text())
    manifest = json.loads((run / "run.json").read_text())
    memory = manifest.get("memory_plan") or {}
    facts = json.loads((run / "logs" / "rank0.json").read_text())
    return {"run": str(run), "status": manifest.get("status"), "losses": summary.get("losses"),
            "resumed_from": summary.get("resumed_from"), "peak_gb": summary["final"].get("memory/peak_gb"),
            "planned_gb": (memory.get("estimates") or {}).get(memory.get("strategy"), {}).get("total_gb"),
            "cap_gb": memory.get("cap_gb"), "memory_fraction": facts.get("memory_fraction"),
            "tokens_per_s": summary.get("median", {}).get("tokens_per_s"),
            "checkpoints": sorted(p.name for p in (run / "checkpoints").glob("step_*"))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="refused_plan.json")
    ap.add_argument("--work", default="/tmp/refused_plan")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--kill", type=int, default=15)
    ap.add_argument("overrides", nargs="*")
    a = ap.parse_args()
    work = Path(a.work)
    shutil.rmtree(work, ignore_errors=True)
    out: dict[str, Any] = {"overrides": a.overrides}

    refused, _ = ddp_run(a.overrides, work / "refused")
    out["refused"] = {"rc": refused.returncode, "message": refused.stderr.strip()[-1500:],
                      "run_dirs": len(run_dirs(work / "refused"))}
    print(f"refused: rc={refused.returncode}\n{refused.stderr.strip()[-1500:]}", flush=True)
    if refused.returncode != 2:
        raise SystemExit("the plan was not refused")
    fixed = fixed_args(a.overrides, refused.stderr)
    common = [*fixed, f"train.max_steps={a.steps}", f"checkpoint.every_steps={a.every}", "train.val_every=0",
              "train.log_every=1"]
    out["fixed"] = fixed
    print("fixed:", " ".join(fixed), flush=True)

    clean, wall = ddp_run(common, work / "clean")
    if clean.returncode != 0:
        raise SystemExit(f"the fixed plan failed:\n{(clean.stdout + clean.stderr)[-3000:]}")
    [clean_dir] = run_dirs(work / "clean")
    out["clean"] = {**report(clean_dir), "wall_s": round(wall, 1)}
    shutil.rmtree(clean_dir / "checkpoints")  # room on the disk for the next run's
    # A second uninterrupted run: how far two runs of the same plan differ on this machine (GPU kernels need not
    # be deterministic), the yardstick for the resumed run's difference.
    again, _ = ddp_run(common, work / "again")
    if again.returncode == 0:
        [again_dir] = run_dirs(work / "again")
        out["again_losses"] = report(again_dir)["losses"]
        shutil.rmtree(again_dir / "checkpoints")

    crash, wall = ddp_run([*common, "fault.kind=sigkill", "fault.rank=0", f"fault.step={a.kill}"], work / "crash")
    [crash_dir] = run_dirs(work / "crash")
    resumed, wall2 = ddp_run([f"resume={crash_dir}"], work / "unused")
    if resumed.returncode != 0:
        raise SystemExit(f"the resume failed:\n{(resumed.stdout + resumed.stderr)[-3000:]}")
    out["crash"] = {"rc": crash.returncode, "wall_s": round(wall, 1)}
    out["resumed"] = {**report(crash_dir), "wall_s": round(wall2, 1)}
    first = out["clean"]["losses"]
    for prefix, other in (("", out["resumed"]["losses"]), ("again_", out.get("again_losses"))):
        if other:
            out[f"{prefix}losses_equal"] = first == other
            out[f"{prefix}max_abs_loss_diff"] = max(abs(x - y) for x, y in zip(first, other, strict=True))
    c = out["clean"]
    out["planned_over_measured"] = c["planned_gb"] / c["peak_gb"] if c["peak_gb"] else None
    print(json.dumps({k: v for k, v in out.items() if k != "refused"}, indent=1), flush=True)
    Path(a.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
