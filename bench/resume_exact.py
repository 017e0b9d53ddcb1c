"""Is a killed-and-resumed run bit for bit the uninterrupted one (issue 42)? On any host: CPU ranks or GPUs.

Runs the plan given as overrides three times under ``--work``: uninterrupted twice (the second is the yardstick:
two runs of one plan differ where the kernels are not deterministic), then with the last rank SIGKILLed after
step ``--kill``, resumed in place (``resume=<run dir>``). Prints and writes (``--out``) a JSON verdict: the logged
losses of each run, whether they are equal, the largest difference, and whether the final checkpoints' model
tensors are equal.

Usage: python bench/resume_exact.py --out exact.json --steps 12 --every 4 --kill 6 -- task=gpt world_size=1
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def ddp_run(args: list[str], root: Path) -> tuple[subprocess.CompletedProcess[str], float]:
    """One ``ddp-run`` under ``root``; the process and its wall time."""
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "ddp_runner", *args, f"output.root={root}"],
                          env={**os.environ, **ENV}, capture_output=True, text=True, timeout=1200)
    return proc, time.perf_counter() - t0


def the_run(root: Path) -> Path:
    """The one run directory under ``root``."""
    [run] = sorted(p.parent for p in root.glob("**/run.json"))
    return run


def losses(run: Path) -> list[float]:
    """Every logged training loss of a run, from its summary."""
    return json.loads((run / "summary.json").read_text())["losses"]


def final_model(run: Path) -> dict[str, Any]:
    """The model tensors of the run's newest checkpoint."""
    import torch

    step = max((p for p in (run / "checkpoints").glob("step_*") if (p / "meta.json").exists()),
               key=lambda p: int(p.name.split("_")[1]))
    return torch.load(step / "state.pt", map_location="cpu", weights_only=False)["model"]


def compare(a: Path, b: Path) -> dict[str, Any]:
    """Losses and final parameters of two runs, side by side."""
    import torch

    la, lb = losses(a), losses(b)
    ma, mb = final_model(a), final_model(b)
    unequal = [k for k in ma if k not in mb or not torch.equal(ma[k], mb[k])]
    return {"losses_equal": la == lb,
            "max_abs_loss_diff": max((abs(x - y) for x, y in zip(la, lb, strict=True)), default=None),
            "params_equal": not unequal and ma.keys() == mb.keys(), "params_unequal": unequal[:8]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="resume_exact.json")
    ap.add_argument("--work", default="/tmp/resume_exact")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--every", type=int, default=4)
    ap.add_argument("--kill", type=int, default=6)
    ap.add_argument("--world", type=int, default=1, help="the plan's world_size (the last rank is killed)")
    ap.add_argument("overrides", nargs="*")
    a = ap.parse_args()
    work = Path(a.work)
    shutil.rmtree(work, ignore_errors=True)
    common = [*a.overrides, f"world_size={a.world}", f"train.max_steps={a.steps}", f"checkpoint.every_steps={a.every}",
              "checkpoint.keep_last=0", "checkpoint.async_save=false", "train.log_every=1"]
    out: dict[str, Any] = {"overrides": common, "kill_after_step": a.kill}
    for name in ("clean", "again"):
        proc, wall = ddp_run(common, work / name)
        if proc.returncode != 0:
            raise SystemExit(f"{name} failed:\n{(proc.stdout + proc.stderr)[-3000:]}")
        out[name] = {"wall_s": round(wall, 1), "losses": losses(the_run(work / name))}
    crash, _ = ddp_run([*common, "fault.kind=sigkill", f"fault.rank={a.world - 1}", f"fault.step={a.kill}"],
                       work / "crash")
    crashed = the_run(work / "crash")
    resumed, wall = ddp_run([f"resume={crashed}"], work / "unused")
    if resumed.returncode != 0:
        raise SystemExit(f"the resume failed:\n{(resumed.stdout + resumed.stderr)[-3000:]}")
    said = [line for line in resumed.stdout.splitlines() if "resumed from step" in line]
    out["resumed"] = {"crash_rc": crash.returncode, "wall_s": round(wall, 1), "console": said,
                      "resumed_from": json.loads((crashed / "summary.json").read_text())["resumed_from"],
                      "losses": losses(crashed)}
    out["resumed_vs_clean"] = compare(crashed, the_run(work / "clean"))
    out["again_vs_clean"] = compare(the_run(work / "again"), the_run(work / "clean"))
    text = json.dumps(out, indent=1)
    Path(a.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
