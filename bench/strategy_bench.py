"""Strategies on GPUs (issue 18): tokens/s, MFU and measured peak memory against the memory planner's estimate.

Through ``ddp-run`` on the visible GPUs, each run short and compiled, at each of ``--worlds`` (default 1 and 2):

1. GPT-2 small at a fixed global batch of 64 sequences (16 per rank) under each of ``--strategies`` (default
   ``ddp``, ``zero1``, ``fsdp``); per strategy, its scaling from 1 GPU to each larger world, and the best.
2. The planner's refusal of ``task=gpt_6b`` under ``strategy=ddp`` on 1 GPU (a dry run: no GPU time).
3. ``task=gpt_6b`` (~6.1B parameters, 8 per rank) with ``strategy=fsdp`` at each world, and ``zero1`` on more
   than one GPU: MFU and peak memory (or the planner's refusal).

Each row: tokens/s (median over the logging windows after the first), MFU, ``memory/peak_gb`` (rank 0's peak
allocated) beside ``run.json``'s ``memory_plan`` estimate and their ratio (goal: within 15%). Workers get
``NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1``. Prints a markdown table and
writes every row as JSON (``--out``). About 8 minutes on 2×H200; ``--only small|big`` runs one part.

Usage: python bench/strategy_bench.py [--worlds 1,2] [--strategies ddp,zero1,fsdp] [--steps 20] [--big-steps 8]
       [--only small|big] [--out strategy.json]
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

ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
SMALL = ["task=gpt2_small", "batch.per_rank=16", "batch.global=64", "train.log_every=5", "train.val_every=0",
         "checkpoint.final=false"]
BIG = ["task=gpt_6b", "batch.per_rank=8", "train.log_every=2", "train.val_every=0", "checkpoint.every_steps=0",
       "checkpoint.final=false"]  # a 6B checkpoint is ~100 GB of shards and a 24 GB model.pt: not what is measured


def ddp_run(args: list[str], root: str, timeout: float = 540) -> tuple[subprocess.CompletedProcess, float]:
    """``python -m ddp_runner <args>`` with the NVLS-off variables; returns the process and its wall time."""
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-m", "ddp_runner", *args, f"output.root={root}"], capture_output=True,
                          text=True, env={**os.environ, **ENV}, timeout=timeout)
    return proc, time.time() - t0


def row(name: str, strategy: str, world: int, proc: subprocess.CompletedProcess, wall: float) -> dict:
    """One run's figures from its summary.json and run.json (or its failure)."""
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr)[-2500:]
        return {"run": name, "strategy": strategy, "world": world, "failed": True, "rc": proc.returncode,
                "tail": tail, "wall_s": wall}
    run_dir = Path(proc.stdout.strip().splitlines()[-1])
    s = json.loads((run_dir / "summary.json").read_text())
    m = json.loads((run_dir / "run.json").read_text())
    plan = (m.get("memory_plan") or {}).get("estimates", {}).get(strategy, {})
    peak = s["final"].get("memory/peak_gb")
    est = plan.get("total_gb")
    return {"run": name, "strategy": strategy, "world": world, "tok_s": s["median"].get("tokens_per_s"),
            "mfu_pct": s["median"].get("mfu_pct"), "step_s": s["median"].get("step_time_s"),
            "first_step_s": s.get("time_to_first_step_s"), "peak_gb": peak, "estimate_gb": est,
            "estimate_over_peak": est / peak if est and peak else None, "estimate": plan,
            "final_loss": s["final"].get("train/loss"), "wall_s": wall, "run_dir": str(run_dir),
            "driver_lines": [ln for ln in proc.stdout.splitlines() if ln.startswith("ddp-run:")]}


def small(steps: int, root: str, worlds: list[int], strategies: list[str]) -> list[dict]:
    """GPT-2 small under each strategy at each world size, one row per run."""
    rows = []
    for world, strategy in ((w, s) for w in worlds for s in strategies):
        proc, wall = ddp_run([*SMALL, f"world_size={world}", f"strategy={strategy}", f"train.max_steps={steps}"],
                             root)
        rows.append(row("gpt2_small", strategy, world, proc, wall))
        print(json.dumps({k: v for k, v in rows[-1].items() if k not in ("estimate", "driver_lines")}), flush=True)
    return rows


def big(steps: int, root: str, worlds: list[int]) -> list[dict]:
    """The 6B model's refusal under DDP on one GPU, then its runs at each world size: FSDP, and zero1 where there
    is more than one rank to shard the optimizer over (a plan the planner refuses is a row with its refusal)."""
    refused, wall = ddp_run(["task=gpt_6b", "world_size=1", "strategy=ddp", "dry_run=true"], root, timeout=120)
    rows = [{"run": "gpt_6b refusal", "strategy": "ddp", "world": 1, "rc": refused.returncode, "wall_s": wall,
             "refusal": refused.stderr.strip()[-1500:]}]
    print(json.dumps(rows[-1]), flush=True)
    for world, strategy in ((w, s) for w in worlds for s in (("fsdp", "zero1") if w > 1 else ("fsdp",))):
        proc, wall = ddp_run([*BIG, f"world_size={world}", f"strategy={strategy}", f"train.max_steps={steps}"],
                             root)
        rows.append(row("gpt_6b", strategy, world, proc, wall))
        if proc.returncode == 2:
            rows[-1].update(refusal=proc.stderr.strip()[-1500:])
        print(json.dumps({k: v for k, v in rows[-1].items() if k not in ("estimate", "driver_lines")}), flush=True)
    return rows


def table(rows: list[dict]) -> str:
    """Markdown: one line per run, and GPT-2 small's scaling from 1 GPU, per strategy and the best."""
    out = ["| run | strategy | GPUs | tokens/s | MFU % | step s | peak GiB | planned GiB | planned/peak | wall s |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]

    def f(v: float | None, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    for r in rows:
        if r.get("failed") or "refusal" in r:
            note = f"rc={r.get('rc')}" + (" (refused as planned)" if r.get("rc") == 2 else "")
            out.append(f"| {r['run']} | {r['strategy']} | {r['world']} | {note} | | | | | | {r['wall_s']:.0f} |")
            continue
        out.append(f"| {r['run']} | {r['strategy']} | {r['world']} | {f(r['tok_s'], ',.0f')} | "
                   f"{f(r['mfu_pct'], '.1f')} | {f(r['step_s'], '.4f')} | {f(r['peak_gb'], '.2f')} | "
                   f"{f(r['estimate_gb'], '.2f')} | {f(r['estimate_over_peak'], '.2f')} | {r['wall_s']:.0f} |")
    out += [""] + scaling_lines(rows)
    return "\n".join(out)


def scaling_lines(rows: list[dict]) -> list[str]:
    """GPT-2 small's scaling efficiency from 1 GPU to each larger world: per strategy, against the same
    strategy's 1-GPU run, and for the best strategy there against the best 1-GPU run."""
    small_rows = [r for r in rows if r["run"] == "gpt2_small" and r.get("tok_s")]
    ones = {r["strategy"]: r["tok_s"] for r in small_rows if r["world"] == 1}
    lines = []
    for world in sorted({r["world"] for r in small_rows} - {1}):
        at = [r for r in small_rows if r["world"] == world]
        per = [f"{r['strategy']} {100 * r['tok_s'] / (world * ones[r['strategy']]):.1f}%"
               for r in at if r["strategy"] in ones]
        if ones and at:
            best = max(at, key=lambda r: r["tok_s"])
            lines.append(f"GPT-2 small scaling 1 → {world} GPUs, best strategy {best['strategy']} against the best"
                         f" on 1 GPU: {100 * best['tok_s'] / (world * max(ones.values())):.1f}%"
                         + (f" (each against itself: {', '.join(per)})" if per else ""))
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20, help="optimizer steps per GPT-2 small run")
    ap.add_argument("--big-steps", type=int, default=8, help="optimizer steps of the gpt_6b run")
    ap.add_argument("--worlds", default="1,2", help="comma-separated world sizes (GPUs), e.g. 1 or 1,2,4")
    ap.add_argument("--strategies", default="ddp,zero1,fsdp", help="GPT-2 small's strategies, comma-separated")
    ap.add_argument("--only", choices=("small", "big"), default=None)
    ap.add_argument("--out", default="strategy_bench.json")
    a = ap.parse_args()
    root = tempfile.mkdtemp(prefix="strategy_bench_")
    worlds = [int(w) for w in a.worlds.split(",")]
    rows: list[dict] = []
    if a.only in (None, "small"):
        rows += small(a.steps, root, worlds, a.strategies.split(","))
    if a.only in (None, "big"):
        rows += big(a.big_steps, root, worlds)
    Path(a.out).write_text(json.dumps(rows, indent=1))
    print(table(rows))


if __name__ == "__main__":
    main()
