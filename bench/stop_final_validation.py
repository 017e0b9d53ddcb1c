"""A stop during the end validation loses nothing (issue 45, item 1), checked on real hardware; one JSON verdict.

1. ``ddp-run <preset> train.max_steps=N`` with the stop tests' hook ``DDP_RUNNER_STOP_AT=validation@N``
   (tasks/engine/diagnostics/faults.py): as the final validation begins, rank 0 sends SIGINT to the driver and waits
   until the stop has come back to it through torchrun, so the stop lands inside that validation on any machine.
   Expected: exit 130, ``interrupted``, every rank ``stopped`` after step N (the last) during the final validation,
   ``checkpoints/step_N`` committed (the final checkpoint: all N steps kept), the console naming it.
2. ``ddp-run resume=<run dir>``: expected exit 0, ``completed``, the final validation's ``val_loss``, still N steps
   (no step trained again) and the final checkpoint left as it was (its ``meta.json`` not rewritten).

Presets: ``gpt2_small`` (GPT-2 small on one GPU: bf16, torch.compile, background saves), ``tiny`` (the tiny GPT on 2
CPU ranks). Anything after ``--`` goes to the first ddp-run. Examples::

    python bench/stop_final_validation.py                       # GPT-2 small, one GPU, 30 steps
    python bench/stop_final_validation.py --preset tiny --steps 6
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PRESETS = {
    "gpt2_small": ["task=gpt2_small", "device=cuda", "world_size=1", "train.warmup_steps=5"],
    "tiny": ["task=gpt", "device=cpu", "world_size=2", "batch.per_rank=4", "train.warmup_steps=1"],
}
ENV_STOP_AT = "DDP_RUNNER_STOP_AT"  # tasks/engine/diagnostics/faults.py (the driver side never imports the engine)


def ddp_run(args: list[str], root: Path, env: dict[str, str] | None = None,
            ) -> tuple[subprocess.CompletedProcess[str], float]:
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "ddp_runner", *args, f"output.root={root}"], capture_output=True,
                       text=True, env={**os.environ, **(env or {})}, timeout=1800)
    return r, round(time.monotonic() - t0, 1)


def read(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", choices=sorted(PRESETS), default="gpt2_small")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--out", default=None, help="output root (default: a fresh temporary folder)")
    ap.add_argument("extra", nargs="*", help="after --: more ddp-run overrides for the first launch")
    a = ap.parse_args()
    root = Path(a.out or tempfile.mkdtemp(prefix="stop-final-val-"))
    n, failures = a.steps, []

    def check(ok: bool, what: str) -> None:
        if not ok:
            failures.append(what)

    first, first_s = ddp_run([*PRESETS[a.preset], f"train.max_steps={n}", *a.extra], root,
                             {ENV_STOP_AT: f"validation@{n}"})
    runs = sorted(p.parent for p in root.rglob("run.json"))
    if len(runs) != 1:
        print(json.dumps({"verdict": "fail", "failures": [f"expected one run directory under {root}, found {runs}"],
                          "rc": first.returncode, "stderr_tail": first.stderr.splitlines()[-15:]}, indent=1))
        return 1
    run = runs[0]
    manifest, summary = read(run / "run.json"), read(run / "summary.json")
    stopped = read(run / "logs" / "rank0.json").get("stopped") or {}
    final = run / "checkpoints" / f"step_{n}" / "meta.json"
    check(first.returncode == 130, f"the stopped launch exits 130 (got {first.returncode})")
    check(manifest.get("status") == "interrupted", f"status interrupted (got {manifest.get('status')})")
    check(stopped.get("step") == n and bool(stopped.get("last_step")), f"every rank stopped after step {n}, the last")
    check(stopped.get("during") == "the final validation", f"the stop came during the final validation ({stopped})")
    check(final.exists(), f"checkpoints/step_{n} committed: all {n} steps kept")
    check(f"checkpoint step_{n} committed, nothing lost" in first.stderr, "the console names the final checkpoint")
    committed = final.stat().st_mtime_ns if final.exists() else None

    second, second_s = ddp_run([f"resume={run}"], root / "unused")
    resumed = read(run / "summary.json")
    check(second.returncode == 0, f"the resume exits 0 (got {second.returncode})")
    check(resumed.get("status") == "completed", f"the resume completes the run (got {resumed.get('status')})")
    check(resumed.get("val_loss") is not None, "the resume ran the final validation (val_loss)")
    check(resumed.get("steps") == n and resumed.get("losses") == summary.get("losses"), "no step was trained again")
    check(final.exists() and final.stat().st_mtime_ns == committed, "the final checkpoint stands as it was")
    print(json.dumps({
        "verdict": "pass" if not failures else "fail", "failures": failures, "preset": a.preset, "steps": n,
        "run_dir": str(run),
        "stopped_launch": {"rc": first.returncode, "seconds": first_s, "status": manifest.get("status"),
                           "stopped": stopped, "final_checkpoint": final.exists(),
                           "console": [ln for ln in first.stderr.splitlines() if ln.startswith("ddp-run:")][-4:]},
        "resume": {"rc": second.returncode, "seconds": second_s, "status": resumed.get("status"),
                   "val_loss": resumed.get("val_loss"), "steps": resumed.get("steps"),
                   "stderr_tail": second.stderr.splitlines()[-5:] if second.returncode else []},
    }, indent=1))
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
