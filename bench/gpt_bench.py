"""GPT-2 small throughput through `ddp-run` on the visible GPUs, beside the hand-written reference loop.

For each world size (1 and, when there are two GPUs, 2) at a fixed global batch of 64 sequences
(micro-batch 16, bf16, compiled), runs

    ddp-run task=gpt2_small world_size=W batch.per_rank=16 batch.global=64 train.max_steps=S

and reads tokens/s, MFU, step time and time to first step from its summary.json. With --reference it then
runs the reference loop (`torchrun --standalone --nproc-per-node=W <ref> --compile`) right after, on the
same machine. Beside each run, nvidia-smi samples every GPU's SM clock, power, temperature and whether the
power cap is holding the clocks down; the table shows the medians over the training steps and the capped share
(an H200 training GPT-2 small runs at its 700 W cap, below its top clock, so machines and runs differ with
the chips' power efficiency and temperature, not only with the code). Prints a markdown table and one JSON
line.

Usage: python bench/gpt_bench.py [--steps 50] [--reference PATH] [--out results.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ddp_runner.tasks.engine.diagnostics.profiling import format_summary  # noqa: E402
from ddp_runner.tasks.engine.diagnostics.telemetry import POWER_BITS  # noqa: E402

# clocks_event_reasons.active is NVML's clock event reason mask; its power bits (POWER_BITS, as in the runner's
# own telemetry) mean the driver lowered the clocks to hold the board's power limit. Drivers without the field
# get BASIC_QUERY.
GPU_QUERY = "index,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active"
BASIC_QUERY = "index,clocks.sm,power.draw,temperature.gpu"
TOKENS_PER_STEP = 64 * 1024  # global batch 64 sequences of 1024 tokens


def mean_window_tok_s(window_step_s: list[float] | None, tokens_per_step: int = TOKENS_PER_STEP) -> float | None:
    """Tokens/s from the mean of the logging windows' step times: steadier than the runner's median when the
    windows are uneven (power-capped GPUs dip about once a second), and None without windows (the reference)."""
    return tokens_per_step / statistics.fmean(window_step_s) if window_step_s else None


def parse_gpu_samples(csv_text: str) -> dict[str, dict[str, float]]:
    """Per GPU, from ``nvidia-smi --query-gpu=GPU_QUERY --format=csv,noheader,nounits`` lines: median SM clock
    (MHz), power (W) and temperature (C), and the share of samples taken while the power cap held the clocks
    down (``power_capped_pct``; absent with BASIC_QUERY lines). Lines that do not parse ("[N/A]") are skipped."""
    per_gpu: dict[str, list[tuple[float, ...]]] = {}
    for line in csv_text.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) not in (4, 5):
            continue
        try:
            sample = tuple(float(f) for f in fields[1:4])
            if len(fields) == 5:
                sample += (float(bool(int(fields[4], 16) & POWER_BITS)),)
        except ValueError:
            continue
        per_gpu.setdefault(fields[0], []).append(sample)
    stats: dict[str, dict[str, float]] = {}
    for gpu, samples in per_gpu.items():
        stats[gpu] = {"sm_clock_mhz": statistics.median(s[0] for s in samples),
                      "power_w": statistics.median(s[1] for s in samples),
                      "temperature_c": statistics.median(s[2] for s in samples), "samples": len(samples)}
        capped = [s[3] for s in samples if len(s) == 4]
        if capped:
            stats[gpu]["power_capped_pct"] = 100 * sum(capped) / len(capped)
    return stats


def _query_fields(exe: str) -> str:
    """GPU_QUERY where this driver knows every field, else BASIC_QUERY."""
    try:
        probe = subprocess.run([exe, f"--query-gpu={GPU_QUERY}", "--format=csv,noheader,nounits"],
                               capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return BASIC_QUERY
    return GPU_QUERY if probe.returncode == 0 else BASIC_QUERY


@contextlib.contextmanager
def gpu_sampler() -> Iterator[list[tuple[float, str]]]:
    """Sample every GPU's SM clock, power and temperature twice a second while the block runs; yields the list
    the (arrival time, CSV line) samples land in. Throughput on these GPUs follows their clocks, which power and
    heat can pull down, so two runs compare fairly only with these beside them. Samples nothing without
    ``nvidia-smi``."""
    samples: list[tuple[float, str]] = []
    exe = shutil.which("nvidia-smi")
    if exe is None:
        yield samples
        return
    proc = subprocess.Popen([exe, f"--query-gpu={_query_fields(exe)}", "--format=csv,noheader,nounits", "-lms", "500"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)

    def read() -> None:
        for line in proc.stdout:  # type: ignore[union-attr]
            samples.append((time.time(), line))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        yield samples
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        reader.join(timeout=10)


def training_gpu_stats(samples: list[tuple[float, str]], since: float, until: float) -> dict[str, dict[str, float]]:
    """``parse_gpu_samples`` of the samples taken between ``since`` (the first step done: not compilation) and
    ``until`` (the last step done: not the exit, when the GPUs idle)."""
    return parse_gpu_samples("\n".join(line for t, line in samples if since <= t <= until))


def sample_series(samples: list[tuple[float, str]], t0: float) -> list[list]:
    """Every sample as ``[seconds since t0, CSV line]``, kept in the results to set clocks beside step times."""
    return [[round(t - t0, 2), line.strip()] for t, line in samples]


def gpu_cell(gpus: dict[str, dict[str, float]]) -> str:
    """'1695/693 cap 96% · 1740/692 cap 100%' for GPUs 0 and 1: median SM clock / power of each GPU that was
    sampled, and the share of its samples held down by the power cap."""
    cells = []
    for _, g in sorted(gpus.items()):
        cap = f" cap {g['power_capped_pct']:.0f}%" if "power_capped_pct" in g else ""
        cells.append(f"{g['sm_clock_mhz']:.0f}/{g['power_w']:.0f}{cap}")
    return " · ".join(cells) or "—"


def gpu_count() -> int:
    import torch

    return torch.cuda.device_count()


def _estimated_span(t0: float, first_step_s: float, step_s: float, steps: int) -> tuple[float, float]:
    """When the reference's measured steps ran, which it does not record: from its first step on, at its median
    step time. (ddp-run records the span, ``perf_span_unix``; in its H200 runs with CUDA graphs, the GPUs'
    power rose to its training level about 3 s after the first step, so this estimate starts early.)"""
    first = t0 + first_step_s
    return first, first + (steps - 1) * step_s


def _ours_cmd(world: int, steps: int, root: str, extra: list[str]) -> list[str]:
    return [sys.executable, "-m", "ddp_runner", "task=gpt2_small", f"world_size={world}", "batch.per_rank=16",
            "batch.global=64", f"train.max_steps={steps}", "train.log_every=5", "train.val_every=0",
            f"output.root={root}", *extra]


def _ours_result(who: str, world: int, proc: subprocess.CompletedProcess, t0: float, wall: float,
                 samples: list[tuple[float, str]]) -> dict:
    """One ddp-run's row, from its summary.json (and its own per-rank GPU telemetry, ``run_gpus``)."""
    if proc.returncode != 0:
        raise RuntimeError(f"ddp-run failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    run_dir = Path(proc.stdout.strip().splitlines()[-1])
    s = json.loads((run_dir / "summary.json").read_text())
    med = s["median"]
    windows = s.get("perf_windows", {}).get("step_time_s")
    return {"who": who, "world": world, "tok_s": med["tokens_per_s"], "tok_s_mean": mean_window_tok_s(windows),
            "mfu_pct": med["mfu_pct"],
            "step_s": med["step_time_s"], "first_step_s": s["time_to_first_step_s"], "wall_s": wall,
            "peak_mem_gb": s["final"].get("memory/peak_gb"), "final_loss": s["final"].get("train/loss"),
            "window_step_s": windows, "run_dir": str(run_dir),
            "gpus": training_gpu_stats(samples, *s["perf_span_unix"]), "run_gpus": s.get("gpus"),
            "gpu_samples": sample_series(samples, t0),
            # the driver's own lines: the batch, the outcome, each rank's GPU medians
            "driver_lines": [ln for ln in proc.stdout.splitlines() if ln.startswith("ddp-run:")]}


def run_ours_each_gpu(gpus: int, steps: int, root: str, extra: list[str]) -> list[dict]:
    """One 1-GPU ddp-run on each of GPUs 0 … gpus-1, all at once (CUDA_VISIBLE_DEVICES=i each).

    A multi-GPU run waits for its slowest GPU at every step, and under a power cap GPUs of one host differ
    (one runs hotter and clocks lower); this gives each GPU's own single-GPU rate, measured together.
    """
    who = " ".join(["ddp-run", *extra])
    t0 = time.time()
    with gpu_sampler() as samples:
        procs = [subprocess.Popen(_ours_cmd(1, steps, f"{root}/gpu{i}", extra), stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env={**os.environ, "CUDA_VISIBLE_DEVICES": str(i)})
                 for i in range(gpus)]
        outs = [p.communicate() for p in procs]
    done = [subprocess.CompletedProcess(p.args, p.returncode, out, err)
            for p, (out, err) in zip(procs, outs, strict=True)]
    wall = time.time() - t0
    rows = []
    for i, d in enumerate(done):
        row = _ours_result(who if i == 0 else f"{who} (GPU {i} alone)", 1, d, t0, wall, samples)
        row["gpu"] = i
        rows.append(row)
    return rows


def each_gpu_scaling(rows: list[dict]) -> dict[str, float]:
    """For each multi-GPU ddp-run row of a variant: its tokens/s over the sum of the single-GPU rates of the GPUs
    it ran on (rows with a ``gpu`` index, from :func:`run_ours_each_gpu`), keyed by the row's ``who``."""
    out = {}
    for r in rows:
        if r["world"] < 2 or r["who"] == "reference":
            continue
        singles = {x["gpu"]: x["tok_s"] for x in rows
                   if x["world"] == 1 and "gpu" in x and x["who"].split(" (GPU")[0] == r["who"]}
        if all(i in singles for i in range(r["world"])):
            out[r["who"]] = r["tok_s"] / sum(singles[i] for i in range(r["world"]))
    return out


def run_ours(world: int, steps: int, root: str, extra: list[str], profile: bool = False,
             trace_dir: str | None = None) -> dict:
    who = " ".join(["ddp-run", *extra])
    if profile:  # trace two steps near the end, after compilation and warm-up
        extra = [*extra, "train.profile.steps=2", f"train.profile.start={max(0, steps - 4)}"]
    t0 = time.time()
    with gpu_sampler() as samples:
        proc = subprocess.run(_ours_cmd(world, steps, root, extra), capture_output=True, text=True)
    out = _ours_result(who, world, proc, t0, time.time() - t0, samples)
    run_dir = Path(out["run_dir"])
    if profile:
        out["profile"] = {}
        for f in sorted((run_dir / "profile").glob("rank*.summary.json")):
            out["profile"][f.name.split(".")[0]] = json.loads(f.read_text())
        if trace_dir:
            Path(trace_dir).mkdir(parents=True, exist_ok=True)
            tag = "".join(c if c.isalnum() else "_" for c in out["who"])[:60]
            for src in sorted((run_dir / "profile").glob("rank*.trace.json.gz")):
                shutil.copy(src, Path(trace_dir) / f"w{world}_{tag}_{src.name}")
    return out


def run_reference(world: int, path: str, steps: int) -> dict:
    cmd = ["torchrun", "--standalone", f"--nproc-per-node={world}", path, "--compile", "--global-seqs", "64",
           "--micro", "16", "--steps", str(steps)]
    t0 = time.time()
    with gpu_sampler() as samples:
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "T0": repr(t0)})
    if proc.returncode != 0:
        raise RuntimeError(f"reference failed:\n{proc.stderr[-3000:]}")
    r = json.loads([ln for ln in proc.stdout.splitlines() if ln.startswith("{")][-1])
    return {"who": "reference", "world": world, "tok_s": r["tok_s"], "mfu_pct": 100 * r["mfu_vs_989"],
            "step_s": r["step_s"], "first_step_s": r["launch_to_first_step_s"], "wall_s": time.time() - t0,
            "peak_mem_gb": r["mem_gb"],
            "gpus": training_gpu_stats(samples, *_estimated_span(t0, r["launch_to_first_step_s"], r["step_s"], steps)),
            "gpu_samples": sample_series(samples, t0)}


def table(rows: list[dict], base: dict[str, float]) -> None:
    """Print the markdown table of ``rows``, setting each row's ``scaling_efficiency`` against ``base`` (1-GPU
    tokens/s by variant)."""
    print("| runner | GPUs | tokens/s | mean of windows | tokens/s/GPU | MFU % | step s | scaling eff. | first step s |"
          " wall s | SM MHz / W (power-capped share) while training |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        # Against the same variant's 1-GPU figure, else plain ddp-run's.
        one = base.get(r["who"]) or (base.get("ddp-run") if r["who"].startswith("ddp-run") else None)
        eff = r["tok_s"] / (r["world"] * one) if one else None
        r["scaling_efficiency"] = eff
        mean = r.get("tok_s_mean")
        print(f"| {r['who']} | {r['world']} | {r['tok_s']:,.0f} | {'' if mean is None else f'{mean:,.0f}'} |"
              f" {r['tok_s'] / r['world']:,.0f} |"
              f" {r['mfu_pct']:.1f} | {r['step_s']:.4f} | {'' if eff is None else f'{100 * eff:.1f}%'} |"
              f" {r['first_step_s']:.1f} | {r['wall_s']:.1f} | {gpu_cell(r.get('gpus') or {})} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--reference", default=None, help="path of gpt_ddp_reference.py to run beside ours")
    ap.add_argument("--out", default=None)
    ap.add_argument("--worlds", default="1,2", help="world sizes to run (those above the GPU count are skipped)")
    ap.add_argument("--set", action="append", default=[], help="extra ddp-run override, e.g. train.ddp_bucket_mb=100")
    ap.add_argument("--no-ours", action="store_true", help="run only the reference")
    ap.add_argument("--profile", action="store_true", help="trace two steps with torch.profiler; print the summary")
    ap.add_argument("--trace-dir", default=None, help="with --profile: copy rank 0's trace here")
    ap.add_argument("--label", default=None, help="name of this variant in the table (default: its overrides)")
    ap.add_argument("--each-gpu", action="store_true",
                    help="run the 1-GPU case on every visible GPU at once, and give the multi-GPU runs' scaling against"
                         " the sum of those single-GPU rates as well")
    a = ap.parse_args()
    root = tempfile.mkdtemp(prefix="gpt-bench-")
    worlds = [w for w in map(int, a.worlds.split(",")) if w <= gpu_count()]
    if not worlds:
        print("gpt_bench: no CUDA device visible; this benchmark needs GPUs (skipped)")
        return
    rows = []
    for w in worlds:
        if not a.no_ours:
            if w == 1 and a.each_gpu:
                new = run_ours_each_gpu(gpu_count(), a.steps, root, a.set)
            else:
                new = [run_ours(w, a.steps, root, a.set, a.profile, a.trace_dir)]
            for r in new:
                if a.label:
                    r["who"] = r["who"].replace(" ".join(["ddp-run", *a.set]), a.label, 1)
            rows += new
        if a.reference:
            rows.append(run_reference(w, a.reference, a.steps))
    base = {r["who"]: r["tok_s"] for r in rows if r["world"] == 1}
    if a.out and Path(a.out).exists():  # earlier invocations' rows give the 1-GPU baselines
        rows = json.loads(Path(a.out).read_text()) + rows
        base = {**{r["who"]: r["tok_s"] for r in rows if r["world"] == 1}, **base}
    per_gpu = each_gpu_scaling(rows)
    table(rows, base)
    for r in rows:
        if r["world"] > 1 and r["who"] in per_gpu:
            r["scaling_vs_each_gpu"] = per_gpu[r["who"]]
            std = r["scaling_efficiency"]
            print(f"\n{r['who']} on {r['world']} GPUs: "
                  + ("" if std is None else f"{100 * std:.1f}% of {r['world']} × GPU 0 alone; ")
                  + f"{100 * per_gpu[r['who']]:.1f}% of GPUs 0–{r['world'] - 1} alone, summed (run together)")
    for r in rows:
        for rank, prof in (r.get("profile") or {}).items():
            print(f"\n{r['who']} (GPUs: {r['world']}) {rank}\n{format_summary(prof)}")
    print(json.dumps(rows))
    if a.out:
        Path(a.out).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
