"""Concurrent sweeps: N world-size-1 jobs run one after another, then side by side (``sweep.parallel=auto``), on
the same devices; wall-clock of each sweep, and each job's throughput against the same job run alone.

GPUs (the issue's shape: four GPT-2 small jobs on two GPUs)::

    python bench/sweep_bench.py --task gpt2_small --jobs 4 --steps 50 --device cuda

CPU (the same shape on cores: four tiny GPT jobs on the cores this process may use)::

    python bench/sweep_bench.py --task gpt --jobs 4 --steps 30 --device cpu -- task.model.layers=2

First a warm-up job (fills the compile cache every later job shares), then one job alone (the reference
throughput; on CPU pinned to one core, as a concurrent job is), then the sequential sweep, then the concurrent
one. The jobs differ only in ``seed``. Goal (issue 32): concurrent ≤ 0.55 × sequential wall-clock on 2 GPUs, each
job's tokens/s within 3 % of alone. Writes ``<out>/sweep_bench.json`` and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BIN = Path(sys.executable).parent


def ddp_run(args: list[str], root: Path, cores: set[int] | None = None) -> float:
    """Run ``ddp-run <args>`` into ``root``; its wall-clock seconds (it must succeed)."""
    cmd = [str(BIN / "ddp-run"), *args, f"output.root={root}"]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True,
                       preexec_fn=(lambda: os.sched_setaffinity(0, cores)) if cores else None)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"failed ({r.returncode}): {' '.join(cmd)}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return wall


def rate(run: Path) -> tuple[float | None, str]:
    """A run's median throughput and its unit (tokens/s for a task with tokens, else samples/s)."""
    summary = json.loads((run / "summary.json").read_text())
    median = summary.get("median") or {}
    if median.get("tokens_per_s"):
        return median["tokens_per_s"], "tokens/s"
    step, batch = median.get("step_time_s"), summary.get("global_batch")
    return (batch / step if step and batch else None), "samples/s"


def sweep_runs(root: Path) -> list[dict[str, Any]]:
    [sweep] = list(root.glob("*/*_sweep"))
    return json.loads((sweep / "sweep.json").read_text())["jobs"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", default="gpt2_small")
    ap.add_argument("--jobs", type=int, default=4)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--out", default=None, help="output root (default: a temp dir)")
    ap.add_argument("extra", nargs="*", help="more overrides for every job (after --)")
    a = ap.parse_args()
    out = Path(a.out or tempfile.mkdtemp(prefix="sweep-bench-"))
    base = [f"task={a.task}", f"device={a.device}", "world_size=1", f"train.max_steps={a.steps}",
            "checkpoint.final=false", *a.extra]
    seeds = ",".join(str(s) for s in range(1, a.jobs + 1))
    one_core = {min(os.sched_getaffinity(0))} if a.device == "cpu" else None

    ddp_run([*base, "seed=1"], out / "warmup", one_core)
    alone_wall = ddp_run([*base, "seed=1"], out / "alone", one_core)
    [alone_run] = [p.parent for p in (out / "alone").rglob("summary.json")]
    alone_rate, unit = rate(alone_run)
    sequential_wall = ddp_run(["-m", *base, f"seed={seeds}"], out / "sequential")
    concurrent_wall = ddp_run(["-m", *base, f"seed={seeds}", "sweep.parallel=auto"], out / "concurrent")

    rows = []
    for kind in ("sequential", "concurrent"):
        for j in sweep_runs(out / kind):
            r, _ = rate(Path(j["run_dir"]))
            rows.append({"sweep": kind, "job": j["job"], "status": j["status"], "rate": r,
                         "vs_alone": r / alone_rate if r and alone_rate else None,
                         "devices": j.get("gpus") or j.get("cores")})
    conc = [r["vs_alone"] for r in rows if r["sweep"] == "concurrent" and r["vs_alone"]]
    result = {"task": a.task, "device": a.device, "jobs": a.jobs, "steps": a.steps, "extra": a.extra,
              "alone_wall_s": round(alone_wall, 2), "alone_rate": alone_rate, "unit": unit,
              "sequential_wall_s": round(sequential_wall, 2), "concurrent_wall_s": round(concurrent_wall, 2),
              "concurrent_over_sequential": round(concurrent_wall / sequential_wall, 3),
              "worst_job_vs_alone": round(min(conc), 4) if conc else None,
              "median_job_vs_alone": round(statistics.median(conc), 4) if conc else None, "rows": rows}
    (out / "sweep_bench.json").write_text(json.dumps(result, indent=2))
    print(f"| sweep | wall-clock | × sequential |\n|---|---|---|\n| sequential | {sequential_wall:.1f} s | 1.00 |\n"
          f"| concurrent | {concurrent_wall:.1f} s | {concurrent_wall / sequential_wall:.2f} |\n")
    print(f"| sweep | job | devices | {unit} | × alone ({alone_rate:,.0f}) |\n|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['sweep']} | {r['job']} | {r['devices'] or '-'} | {r['rate'] or 0:,.0f} | "
              f"{r['vs_alone'] or 0:.3f} |")
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}))


if __name__ == "__main__":
    main()
