"""Issue 33 on one GPU, in one call: end-validation time, the last logging window, ddp against fsdp, and candidate
MFU levers for GPT-2 small, each run beside the hand-written reference of the same call.

Every run is ``ddp-run task=gpt2_small world_size=1 batch.per_rank=16 batch.global=64 train.max_steps=32
train.log_every=5 checkpoint.final=false <variant>`` under one output root (so later runs find what earlier ones
compiled: the first run pays the cold compile), with the end validation at ``train.val_samples`` default (the
whole validation split, 1,168 sequences of the default corpus). 32 steps at 5 per window: windows 10-30 and a
last window of 2 steps, the shape that read +36% for gpt2_medium before the fix; ``last/others`` is the last
window's tokens/s over the median of the windows before it (after the first).

Runs, in order (``--only 1,3,5`` picks some; a run that would start after ``--budget-s`` is skipped and said so):

 1. the reference, ``torchrun --nproc-per-node=1 <ref> --compile --global-seqs 64 --micro 16 --steps 30``
 2. ddp, ``train.val_compile=eager``: the end validation with no compile (on a fresh machine: the cold figure)
 3. ddp, ``train.val_compile=compiled``: its inference graph compiled from nothing (training's graphs warm)
 4. ddp, ``train.val_compile=compiled`` again: the inference graph from the compile cache (the warm figure)
 5. ddp, ``train.timing_every=0 train.gpu_telemetry=false`` (the engine's own instruments off; graphs warm)
 6. fsdp (per-block compile, no CUDA graphs)
 7. fsdp, ``strategy.reshard_after_forward=false``: no second all-gather per block in the backward
 8. ddp, 32 per rank × 2 micro-steps (fewer, larger micro-steps)
 9. ddp, ``task.model.attention=cudnn``
10. ddp, ``train.compile_scope=blocks``: what compiling per block costs without FSDP (beside 6: fsdp's own cost)
11. ddp, 64 per rank × 1 micro-step
12. ddp, ``+train.inductor.coordinate_descent_tuning=true`` (longer compile)

At most about 8 minutes on a fresh H200 with the default budget (no run starts after 400 s; cold compiles in runs
2, 3, 6, 8-12), so the later levers may be listed as skipped: ``--only`` runs them in a second call. Prints one
markdown table and writes every row as JSON (``--out``).

Usage: python bench/levers_bench.py --reference shared/reference/gpt_ddp_reference.py [--out levers.json]
       [--only 1,2,3,4,5,6] [--budget-s 400] [--steps 32] [--add "label=override,override" ...]
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpt_bench import gpu_cell, gpu_sampler, mean_window_tok_s, run_reference, training_gpu_stats  # noqa: E402

ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
BASE = ["task=gpt2_small", "world_size=1", "batch.per_rank=16", "batch.global=64", "train.log_every=5",
        "train.val_every=0", "checkpoint.final=false"]
VAL_EAGER, VAL_COMPILED = ["train.val_compile=eager"], ["train.val_compile=compiled"]
RUNS: list[tuple[str, list[str]]] = [
    ("reference", []),
    ("ddp, validation eager", VAL_EAGER),
    ("ddp, validation compiled (eval graph cold)", VAL_COMPILED),
    ("ddp, validation compiled (eval graph cached)", VAL_COMPILED),
    ("ddp, timing and telemetry off", ["train.timing_every=0", "train.gpu_telemetry=false", *VAL_EAGER]),
    ("fsdp", ["strategy=fsdp", *VAL_EAGER]),
    ("fsdp, reshard_after_forward=false", ["strategy=fsdp", "strategy.reshard_after_forward=false", *VAL_EAGER]),
    ("ddp, 32 per rank × 2", ["batch.per_rank=32", *VAL_EAGER]),
    ("ddp, attention=cudnn", ["task.model.attention=cudnn", *VAL_EAGER]),
    ("ddp, compile_scope=blocks", ["train.compile_scope=blocks", *VAL_EAGER]),
    ("ddp, 64 per rank × 1", ["batch.per_rank=64", *VAL_EAGER]),
    ("ddp, coordinate descent tuning", ["+train.inductor.coordinate_descent_tuning=true", *VAL_EAGER]),
]


def last_over_others(tok_s: list[float]) -> float | None:
    """The last window's tokens/s over the median of the windows before it (None with fewer than two)."""
    if len(tok_s) < 2:
        return None
    return tok_s[-1] / statistics.median(tok_s[:-1])


def run_ours(label: str, extra: list[str], steps: int, root: str) -> dict:
    """One ddp-run; its row from summary.json."""
    cmd = [sys.executable, "-m", "ddp_runner", *BASE, f"train.max_steps={steps}", f"output.root={root}", *extra]
    t0 = time.time()
    with gpu_sampler() as samples:
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **ENV}, timeout=400)
    wall = time.time() - t0
    if proc.returncode != 0:
        return {"label": label, "failed": True, "rc": proc.returncode, "wall_s": wall,
                "tail": (proc.stdout + proc.stderr)[-2500:]}
    run_dir = Path(proc.stdout.strip().splitlines()[-1])
    s = json.loads((run_dir / "summary.json").read_text())
    med, windows = s.get("median") or {}, s.get("perf_windows") or {}
    val = s.get("validation") or {}
    return {"label": label, "overrides": extra, "tok_s": med.get("tokens_per_s"), "mfu_pct": med.get("mfu_pct"),
            "tok_s_mean": mean_window_tok_s(windows.get("step_time_s")),
            "window_tok_s": windows.get("tokens_per_s"), "last_over_others": last_over_others(
                windows.get("tokens_per_s") or []),
            "first_step_s": s.get("time_to_first_step_s"), "wall_s": wall,
            "val_s": val.get("last_s"), "val_mode": val.get("compile_mode"), "val_graphs": val.get("graphs_compiled"),
            "goodput_s": (s.get("goodput") or {}).get("seconds"), "compile": s.get("compile"),
            "peak_gb": (s.get("final") or {}).get("memory/peak_gb"), "run_dir": str(run_dir),
            "gpus": training_gpu_stats(samples, *s["perf_span_unix"]) if s.get("perf_span_unix") else {}}


def _f(v: float | None, fmt: str) -> str:
    return "" if v is None else format(v, fmt)


def table(rows: list[dict]) -> None:
    """The one table: every run beside the reference's tokens/s."""
    ref = next((r["tok_s"] for r in rows if r["label"] == "reference" and not r.get("failed")), None)
    print("| # | run | tokens/s | vs ref | mean of windows | MFU % | last/others | first step s | end validation s"
          " (mode, graphs) | wall s | peak GiB | SM MHz / W |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if r.get("failed") or r.get("skipped"):
            why = "skipped: over --budget-s" if r.get("skipped") else f"FAILED rc {r.get('rc')}"
            print(f"| {r['n']} | {r['label']} | {why} |||||||||")
            continue
        vs = f"{100 * (r['tok_s'] / ref - 1):+.1f}%" if ref and r["label"] != "reference" else ""
        val = "" if r.get("val_s") is None else f"{r['val_s']:.2f} ({r['val_mode']}, {r['val_graphs']})"
        print(f"| {r['n']} | {r['label']} | {r['tok_s']:,.0f} | {vs} | {_f(r.get('tok_s_mean'), ',.0f')} |"
              f" {_f(r.get('mfu_pct'), '.1f')} | {_f(r.get('last_over_others'), '.3f')} |"
              f" {_f(r.get('first_step_s'), '.1f')} | {val} | {r['wall_s']:.1f} | {_f(r.get('peak_gb'), '.2f')} |"
              f" {gpu_cell(r.get('gpus') or {})} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reference", default=None, help="path of gpt_ddp_reference.py (required on a GPU)")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--only", default=None, help="run numbers to run, e.g. 1,2,3,4")
    ap.add_argument("--budget-s", type=float, default=400, help="start no run after this many seconds")
    ap.add_argument("--out", default=None)
    ap.add_argument("--base", default="", metavar="OVERRIDE,OVERRIDE",
                    help="change the runs' common overrides, e.g. task=gpt2_xl,batch.per_rank=8 (another preset)")
    ap.add_argument("--add", action="append", default=[], metavar="LABEL=OVERRIDE,OVERRIDE",
                    help="one more ddp-run after the listed ones (numbered on from them): its label and overrides")
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="check this script on a CPU: the tiny GPT instead of GPT-2 small, no reference")
    a = ap.parse_args()
    if a.cpu_smoke:
        BASE[:] = ["task=gpt", "task.model.layers=1", "device=cpu", "world_size=1", "batch.per_rank=8",
                   "train.log_every=5", "train.val_every=0", "checkpoint.final=false", "train.compile=true",
                   "train.val_samples=64"]
    if not a.reference and not a.cpu_smoke:
        ap.error("--reference is required: every figure is set beside the reference of the same call")
    for override in (o for o in a.base.split(",") if o):
        key = override.split("=", 1)[0]
        BASE[:] = [b for b in BASE if b.split("=", 1)[0] != key] + [override]
    for spec in a.add:
        label, _, overrides = spec.partition("=")
        RUNS.append((label, [o for o in overrides.split(",") if o]))
    chosen = {int(x) for x in a.only.split(",")} if a.only else set(range(1, len(RUNS) + 1))
    chosen |= set(range(len(RUNS) - len(a.add) + 1, len(RUNS) + 1))
    root = tempfile.mkdtemp(prefix="levers-")
    t_start, rows = time.time(), []
    for n, (label, extra) in enumerate(RUNS, start=1):
        if n not in chosen:
            continue
        if time.time() - t_start > a.budget_s:
            rows.append({"n": n, "label": label, "skipped": True})
            continue
        if label == "reference" and a.cpu_smoke:
            continue
        if label == "reference":
            r = run_reference(1, a.reference, a.steps - 2)
            r = {**r, "label": label, "peak_gb": r.get("peak_mem_gb")}
        else:
            r = run_ours(label, extra, a.steps, root)
        r["n"] = n
        rows.append(r)
        print(f"levers_bench: {n} {label}: {r.get('tok_s') or r.get('tail', '')} ({time.time() - t_start:.0f} s)",
              flush=True)
    table(rows)
    print(json.dumps([{k: v for k, v in r.items() if k not in ("gpu_samples",)} for r in rows]))
    if a.out:
        Path(a.out).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
