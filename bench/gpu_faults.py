"""Fault rehearsal on GPUs (issue 15's goals on 2×H200/NCCL): a real SIGSTOP of rank 1 from outside, an injected
hang, a SIGKILL and a CUDA out-of-memory on rank 1 of ``task=gpt``, each through the real CLI.

For every case it prints how long the run took to end after the fault, the root cause ``summary.json`` records
(rank, class, message), whether the stuck rank's stack is on disk, and whether any process of the run is left.

    python bench/gpu_faults.py --out $OUT/faults [--watchdog 20] [-- extra ddp-run overrides]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

GPU_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def _progress(root: Path, rank: int) -> dict[str, Any] | None:
    for p in root.rglob(f"logs/progress/rank{rank}.json"):
        try:
            return json.loads(p.read_text())
        except (OSError, ValueError):
            return None
    return None


def _left(pids: set[int]) -> list[int]:
    return [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


def case(name: str, overrides: list[str], root: Path, stop_rank: int | None, fault_step: int,
         timeout: float) -> dict[str, Any]:
    """One run; ``stop_rank``: SIGSTOP that rank from outside once it has passed ``fault_step``."""
    env = {**os.environ, **GPU_ENV}
    t_start = time.monotonic()
    driver = subprocess.Popen([sys.executable, "-m", "ddp_runner", *overrides, f"output.root={root}"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pids: set[int] = set()
    t_fault = None
    deadline = time.monotonic() + timeout
    while driver.poll() is None and time.monotonic() < deadline:
        try:
            pids |= {p.pid for p in psutil.Process(driver.pid).children(recursive=True)}
        except psutil.Error:
            pass
        prog = _progress(root, 1)
        if prog and t_fault is None and int(prog.get("step", 0)) >= fault_step:
            t_fault = time.monotonic()
            if stop_rank is not None:
                os.kill(int(_progress(root, stop_rank)["pid"]), signal.SIGSTOP)
        time.sleep(0.2)
    if driver.poll() is None:
        driver.kill()
    out, err = driver.communicate()
    t_end = time.monotonic()
    time.sleep(2)
    summaries = list(root.rglob("summary.json"))
    summary = json.loads(summaries[0].read_text()) if summaries else {}
    rc = summary.get("root_cause") or {}
    stacks = sorted(str(p.relative_to(p.parents[2])) for p in root.rglob("logs/stacks/*") if p.is_file())
    return {"case": name, "exit": driver.returncode, "wall_s": round(t_end - t_start, 1),
            "ended_after_fault_s": round(t_end - t_fault, 1) if t_fault else None,
            "root_cause": {k: rc.get(k) for k in ("rank", "class", "message", "where")},
            "consequences": rc.get("consequences"), "stacks": stacks, "processes_left": _left(pids),
            "console_tail": err.strip().splitlines()[-4:]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "faults"))
    ap.add_argument("--watchdog", type=float, default=20)
    ap.add_argument("--timeout", type=float, default=150, help="per case, seconds")
    ap.add_argument("--cases", default="sigstop,hang,sigkill,oom", help="which cases to run")
    ap.add_argument("overrides", nargs="*")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    base = ["task=gpt", "world_size=2", "train.max_steps=100000", "train.log_every=100", "checkpoint.every_steps=0",
            "checkpoint.final=false", f"watchdog.timeout_s={a.watchdog:g}", "timeout_s=120", *a.overrides]
    cases = [
        ("sigstop", "sigstop rank 1 from outside", base, 1),
        *((k, f"fault.kind={k} rank 1", [*base, f"fault.kind={k}", "fault.rank=1", "fault.step=50"], None)
          for k in ("hang", "sigkill", "oom")),
    ]
    cases = [(name, o, stop) for key, name, o, stop in cases if key in a.cases.split(",")]
    results = []
    for name, overrides, stop in cases:
        root = Path(tempfile.mkdtemp(prefix="faults-", dir=out))
        r = case(name, overrides, root, stop, 50, a.timeout)
        results.append(r)
        print(json.dumps(r), flush=True)
    (out / "faults.json").write_text(json.dumps(results, indent=2))
    print(f"\n{'case':32} {'exit':>4} {'after fault':>11}  root cause")
    for r in results:
        rc = r["root_cause"]
        print(f"{r['case']:32} {r['exit']:>4} {str(r['ended_after_fault_s']) + ' s':>11}  rank {rc['rank']}"
              f" [{rc['class']}] stacks {len(r['stacks'])} files, left {r['processes_left']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
