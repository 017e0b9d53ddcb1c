"""The GPT-2 small scaling study in one go, beside the hand-written reference (issue 14, items 2, 3, 6 and 8).

On a 2-GPU host, one after the other on the same machine:

  (a) reference: ``torchrun --nproc-per-node=W <reference> --compile --global-seqs G --micro P --steps S`` for each
      world size W, each with a fresh compile cache of its own (its time to first step is a cold compile);
  (b) study: ``ddp-run -m world_size=1,2 experiment=fixed_global_batch task=<task> batch.global=G …`` under a fresh
      output root (so a fresh ``<root>/.compile_cache``), once per ``train.compile_scope``: time to first step of
      job 1 (cold) and job 2 (sharing job 1's cache), tokens/s, cache hits, where each step's time goes;
  (c) ``ddp-compare`` over each study's sweep directory, into ``<out>/compare-<scope>/`` (report.md, report.csv,
      plots);
  (d) 1 GPU with and without ``checkpoint.every_steps=5 train.val_every=5``: training throughput must be equal
      within noise (saving and validating are shown separately, in goodput);
  (e) the time breakdown's own cost: ``train.timing_every=1`` (on, the default) against ``0`` (off) on W GPUs;
  (f) ``ddp-doctor --json`` of the host (topology, all-reduce bus bandwidth over the largest world size) into
      ``<out>/doctor.json``, so that the study's figures sit beside what the interconnect can do.

Prints a compact summary at the end and writes every figure to ``<out>/results.json``. A dry run on a CPU host
exercises all of it with the tiny GPT:

    python bench/scaling_study.py --device cpu --task gpt --global-batch 16 --per-rank 8 --steps 6 \\
        --set train.compile=false --out /tmp/study

On 2×H200 (the commands BENCHMARKS.md records): ``python bench/scaling_study.py --reference <copy of
gpt_ddp_reference.py> --out $OUT/scaling``. The NVLink-multicast switches the device notes ask for are set for
every process started here.
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

ROOT = Path(__file__).resolve().parents[1]
# NVLink multicast (NVLS) off for NCCL, symmetric memory and NVSHMEM: the lent machines do not support it.
GPU_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, **GPU_ENV, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get(
        "PYTHONPATH")])), **extra}


def _say(msg: str) -> None:
    print(f"[study {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# -- (a) the reference ----------------------------------------------------------------------------------------

def run_reference(path: str, world: int, a: argparse.Namespace, work: Path) -> dict[str, Any]:
    """One reference run with a compile cache of its own; its JSON line, with the wall time."""
    cache = work / f"ref-cache-w{world}"
    # torchrun through this interpreter, whatever PATH holds
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}", path,
           "--compile", "--global-seqs", str(a.global_batch), "--micro", str(a.per_rank), "--steps", str(a.steps)]
    t0 = time.time()
    proc = _run(cmd, a.timeout, env=_env(T0=repr(t0), TORCHINDUCTOR_CACHE_DIR=str(cache),
                                        TRITON_CACHE_DIR=str(cache / "triton")))
    out: dict[str, Any] = {"world": world, "wall_s": time.time() - t0, "rc": proc.returncode}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        out["error"] = (proc.stderr or proc.stdout)[-2000:]
        return out
    r = json.loads(lines[-1])
    out.update(tok_s=r.get("tok_s"), step_s=r.get("step_s"), first_step_s=r.get("launch_to_first_step_s"),
               mfu_pct=100 * r["mfu_vs_989"] if r.get("mfu_vs_989") is not None else None)
    return out


# -- ddp-run ----------------------------------------------------------------------------------------------------

def common_overrides(a: argparse.Namespace) -> list[str]:
    """What every ddp-run of the study shares."""
    return [f"task={a.task}", f"device={a.device}", f"batch.per_rank={a.per_rank}", f"train.max_steps={a.steps}",
            "train.log_every=5" if a.steps >= 10 else "train.log_every=1", *a.set]


def _run(cmd: list[str], timeout: float, **kw: Any) -> subprocess.CompletedProcess:
    """``cmd``, killed after ``timeout`` seconds (a hang must not eat the whole device call): rc 124 then. Killing
    the driver takes torchrun and the workers with it (they die with their parent)."""
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    except subprocess.TimeoutExpired as exc:
        def text(b: Any) -> str:
            return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")
        return subprocess.CompletedProcess(cmd, 124, text(exc.stdout),
                                           text(exc.stderr) + f"\ntimed out after {timeout} s")


def ddp_run(args: list[str], root: Path, timeout: float) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.time()
    proc = _run([sys.executable, "-m", "ddp_runner", *args, f"output.root={root}"], timeout, env=_env())
    return proc, time.time() - t0


def run_figures(run_dir: Path) -> dict[str, Any]:
    """The figures the study reports from one run directory's summary.json."""
    s = json.loads((run_dir / "summary.json").read_text())
    med = s.get("median") or {}
    g = s.get("goodput") or {}
    tb = s.get("time_breakdown") or {}
    comp = s.get("compile") or {}
    windows = (s.get("perf_windows") or {}).get("tokens_per_s") or []
    return {"run_dir": str(run_dir), "status": s.get("status"), "first_step_s": s.get("time_to_first_step_s"),
            "tok_s": med.get("tokens_per_s"), "samples_s": (s["global_batch"] / med["step_time_s"]
                                                            if med.get("step_time_s") else None),
            "tok_s_spread_pct": (100 * statistics.pstdev(windows) / statistics.fmean(windows)
                                 if len(windows) > 1 else None),
            "step_s": med.get("step_time_s"), "mfu_pct": med.get("mfu_pct"),
            "goodput_shares": g.get("shares"), "goodput_seconds": g.get("seconds"),
            "startup_parts": g.get("startup_parts"), "goodput_tok_s": g.get("tokens_per_s"),
            "time_to_first_checkpoint_s": g.get("time_to_first_checkpoint_s"),
            "cache_hits": comp.get("cache_hits"), "cache_misses": comp.get("cache_misses"),
            "compile_scope": comp.get("scope"), "time_breakdown": tb or None,
            "final_loss": (s.get("losses") or [None])[-1]}


def run_study(scope: str, a: argparse.Namespace, work: Path) -> dict[str, Any]:
    """(b): the fixed-global-batch sweep under a fresh output root; every job's figures."""
    root = work / f"study-{scope}"
    args = ["-m", f"world_size={a.worlds}", "experiment=fixed_global_batch", f"batch.global={a.global_batch}",
            f"train.compile_scope={scope}", *common_overrides(a)]
    proc, wall = ddp_run(args, root, 2 * a.timeout)
    out: dict[str, Any] = {"scope": scope, "command": "ddp-run " + " ".join(args), "wall_s": wall,
                           "rc": proc.returncode, "root": str(root)}
    sweeps = sorted(root.glob("*/*_sweep"))
    if not sweeps:
        out["error"] = (proc.stderr or proc.stdout)[-3000:]
        return out
    out["sweep_dir"] = str(sweeps[-1])
    record = json.loads((sweeps[-1] / "sweep.json").read_text())
    out["jobs"] = []
    for job in record["jobs"]:
        row = {"job": job["job"], "values": job["values"], "status": job["status"]}
        if job.get("run_dir") and (Path(job["run_dir"]) / "summary.json").is_file():
            row.update(run_figures(Path(job["run_dir"])))
        out["jobs"].append(row)
    out["cache_files"] = sum(1 for p in (root / ".compile_cache").rglob("*") if p.is_file())
    return out


def run_compare(study: dict[str, Any], out: Path, project: str | None = None) -> dict[str, Any]:
    """(c): ddp-compare over a study's sweep directory; with ``project``, its scaling projection at those world sizes
    (docs/scaling.md), the links from (f)'s doctor.json where it exists."""
    folder = out / f"compare-{study['scope']}"
    extra = ["--project", project] if project else []
    if project and (out / "doctor.json").is_file():
        extra += ["--links", str(out / "doctor.json")]
    proc = subprocess.run([sys.executable, "-m", "ddp_runner.report.compare", study["sweep_dir"], "--out", str(folder),
                           *extra], capture_output=True, text=True, env=_env())
    return {"out": str(folder), "rc": proc.returncode, "report": proc.stdout[-6000:],
            "error": proc.stderr[-2000:] if proc.returncode else None}


def run_doctor(world: int, device: str, out: Path, sizes: str | None = None) -> dict[str, Any]:
    """(f): ddp-doctor's JSON report of this host, its all-reduce measured over ``world`` processes (at ``sizes``,
    ddp-doctor's ``--sizes``; None: its defaults)."""
    extra = ["--sizes", sizes] if sizes else []
    proc = subprocess.run([sys.executable, "-m", "ddp_runner.diagnostics.doctor", "--json", "--device", device,
                           "--nproc", str(world), *extra], capture_output=True, text=True, env=_env(), timeout=600)
    (out / "doctor.json").write_text(proc.stdout)
    return {"rc": proc.returncode, "out": str(out / "doctor.json"),
            "error": proc.stderr[-2000:] if proc.returncode else None}


def run_pair(name: str, base: list[str], a_args: list[str], b_args: list[str], root: Path,
             timeout: float) -> dict[str, Any]:
    """Two single runs that differ in ``a_args`` against ``b_args``, under one (warm) root; their tokens/s."""
    out: dict[str, Any] = {"name": name}
    for label, extra in (("a", a_args), ("b", b_args)):
        proc, wall = ddp_run([*base, *extra], root, timeout)
        row: dict[str, Any] = {"overrides": extra, "rc": proc.returncode, "wall_s": wall}
        run_dir = Path(proc.stdout.strip().splitlines()[-1]) if proc.stdout.strip() else None
        if proc.returncode == 0 and run_dir and (run_dir / "summary.json").is_file():
            row.update(run_figures(run_dir))
        else:
            row["error"] = (proc.stderr or proc.stdout)[-2000:]
        out[label] = row
    ra, rb = out["a"].get("samples_s"), out["b"].get("samples_s")
    out["b_over_a_pct"] = 100 * (rb / ra - 1) if ra and rb else None
    return out


# -- the summary ------------------------------------------------------------------------------------------------

def _f(v: Any, fmt: str = "{:.1f}") -> str:
    return "—" if v is None else fmt.format(v)


def _pct(share: float | None) -> str:
    return "—" if share is None else f"{100 * share:.1f}%"


def summary_lines(res: dict[str, Any]) -> list[str]:
    """The compact account printed at the end."""
    lines = ["", "=" * 100, "SCALING STUDY SUMMARY", "=" * 100]
    refs = {r["world"]: r for r in res.get("reference", [])}
    for r in refs.values():
        lines.append(f"(a) reference w{r['world']}: first step {_f(r.get('first_step_s'))} s, tokens/s "
                     f"{_f(r.get('tok_s'), '{:,.0f}')}, step {_f(r.get('step_s'), '{:.4f}')} s"
                     + (f"  ERROR rc={r['rc']}" if r.get("error") else ""))
    for st in res.get("studies", []):
        lines.append(f"(b) scope={st['scope']}: sweep rc={st['rc']}, wall {st['wall_s']:.0f} s,"
                     f" {st.get('cache_files', 0)} files in .compile_cache, {st.get('sweep_dir', st.get('error'))}")
        jobs = st.get("jobs") or []
        for j in jobs:
            tb = j.get("time_breakdown") or {}
            sh = tb.get("shares") or {}
            lines.append(
                f"    job {j['job']} {j['values']} {j['status']}: first step {_f(j.get('first_step_s'))} s"
                f" (cache hits {j.get('cache_hits')}, misses {j.get('cache_misses')}), tokens/s"
                f" {_f(j.get('tok_s'), '{:,.0f}')}, MFU {_f(j.get('mfu_pct'))}%; step: data {_pct(sh.get('data'))}"
                f" compute {_pct(sh.get('compute'))} exposed sync {_pct(sh.get('exposed_sync'))}"
                f" optimizer {_pct(sh.get('optimizer'))}, rank gap {_f(tb.get('gap_pct'))}%")
        firsts = [j.get("first_step_s") for j in jobs]
        if len(firsts) >= 2 and all(firsts[:2]):
            ref = (refs.get(1) or {}).get("first_step_s")
            goal1 = f"job 1 {firsts[0]:.1f} s vs reference w1 {_f(ref)} s: " + (
                "MET" if ref and firsts[0] <= ref else "NOT MET" if ref else "no reference")
            goal2 = (f"job 2 {firsts[1]:.1f} s = {100 * firsts[1] / firsts[0]:.0f}% of job 1: "
                     + ("MET" if firsts[1] <= 0.5 * firsts[0] else "NOT MET"))
            lines.append(f"    goals: {goal1}; {goal2}")
            for j in jobs:
                r = refs.get(int(j["values"].get("world_size", 0)))
                if r and r.get("tok_s") and j.get("tok_s"):
                    lines.append(f"    w{j['values']['world_size']} tokens/s against the reference:"
                                 f" {100 * j['tok_s'] / r['tok_s']:.1f}%")
    for c in res.get("compare", []):
        lines.append(f"(c) ddp-compare rc={c['rc']} -> {c['out']}")
        lines += ["    " + ln for ln in c["report"].splitlines() if ln.startswith("- ")]
    for p in res.get("pairs", []):
        a, b = p["a"], p["b"]
        lines.append(f"({p['name']}) {' '.join(a['overrides']) or 'base'}: {_f(a.get('tok_s'), '{:,.0f}')} tok/s"
                     f" (window spread {_f(a.get('tok_s_spread_pct'))}%) | {' '.join(b['overrides'])}:"
                     f" {_f(b.get('tok_s'), '{:,.0f}')} tok/s (spread {_f(b.get('tok_s_spread_pct'))}%) |"
                     f" second/first {_f(p.get('b_over_a_pct'), '{:+.2f}')}%")
        if b.get("goodput_shares"):
            shares = ", ".join(f"{k} {100 * v:.1f}%" for k, v in b["goodput_shares"].items() if v)
            lines.append(f"    goodput shares of the second: {shares}; time to first checkpoint"
                         f" {_f(b.get('time_to_first_checkpoint_s'))} s")
    lines.append(f"total wall {res.get('wall_s', 0):.0f} s")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reference", default=None, help="path of gpt_ddp_reference.py (omit: no reference runs)")
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "scaling"),
                    help="folder for results.json and the compare reports (default $OUT/scaling)")
    ap.add_argument("--task", default="gpt2_small")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--worlds", default="1,2", help="world sizes of the study")
    ap.add_argument("--global-batch", type=int, default=64, help="sequences per optimizer step, fixed")
    ap.add_argument("--per-rank", type=int, default=16)
    ap.add_argument("--steps", type=int, default=30, help="optimizer steps of every run")
    ap.add_argument("--pair-steps", type=int, default=40, help="optimizer steps of the (d) and (e) runs")
    ap.add_argument("--scopes", default="model,blocks", help="train.compile_scope values to study")
    ap.add_argument("--parts", default="a,b,c,d,e,f", help="which parts to run")
    ap.add_argument("--set", action="append", default=[], help="extra ddp-run override for every run")
    ap.add_argument("--doctor-sizes", default=None,
                    help="(f): ddp-doctor's all-reduce sizes, e.g. 1M,4M (default: ddp-doctor's own)")
    ap.add_argument("--work", default=None,
                    help="folder for the runs (default: a fresh temporary one). A later call with the same --work"
                         " (e.g. outputs/study on a machine still warm) reuses its compile caches")
    ap.add_argument("--project", default=None,
                    help="(c) with ddp-compare --project N,N,…: the scaling projection, fitted to the smaller half of"
                         " --worlds and checked on the rest; (f) then runs first, so that it prices the links")
    ap.add_argument("--timeout", type=float, default=180,
                    help="seconds before a run is killed (a sweep gets twice as long)")
    a = ap.parse_args(argv)
    parts = set(a.parts.split(","))
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(a.work).resolve() if a.work else Path(tempfile.mkdtemp(prefix="scaling-study-"))
    work.mkdir(parents=True, exist_ok=True)
    res: dict[str, Any] = {"args": vars(a), "work": str(work), "reference": [], "studies": [], "compare": [],
                           "pairs": []}
    t0 = time.time()

    def save() -> None:  # after every run: a study cut short by a time limit keeps what it measured
        res["wall_s"] = time.time() - t0
        (out / "results.json").write_text(json.dumps(res, indent=2, default=str))

    worlds = [int(w) for w in a.worlds.split(",")]
    doctor_first = bool(a.project) and "f" in parts
    if doctor_first:
        _say(f"(f) ddp-doctor over {max(worlds)} process(es), first: the projection prices its links")
        res["doctor"] = run_doctor(max(worlds), a.device, out, a.doctor_sizes)
    if "a" in parts and a.reference:
        for w in worlds:
            _say(f"(a) reference on {w} GPU(s)")
            res["reference"].append(run_reference(a.reference, w, a, work))
            save()
    for scope in a.scopes.split(",") if "b" in parts else []:
        _say(f"(b) study, compile scope {scope}")
        st = run_study(scope, a, work)
        res["studies"].append(st)
        save()
        if "c" in parts and st.get("sweep_dir"):
            _say(f"(c) ddp-compare {st['sweep_dir']}")
            res["compare"].append(run_compare(st, out, a.project))
            save()
    # The pairs run under the first study's root: its compile cache is warm, so they start quickly.
    warm = work / f"study-{a.scopes.split(',')[0]}"
    single = [*common_overrides(a), f"train.max_steps={a.pair_steps}", f"batch.global={a.global_batch}",
              f"train.compile_scope={a.scopes.split(',')[0]}"]
    if "d" in parts:
        _say("(d) 1 GPU without and with checkpoints and validation every 5 steps")
        res["pairs"].append(run_pair("d", ["world_size=1", *single, "train.val_samples=256"],
                                     ["checkpoint.every_steps=0", "train.val_every=0"],
                                     ["checkpoint.every_steps=5", "train.val_every=5"], warm, a.timeout))
        save()
    if "e" in parts:
        w = max(worlds)
        _say(f"(e) the time breakdown's cost on {w} GPU(s): timing off, then on")
        res["pairs"].append(run_pair("e", [f"world_size={w}", *single], ["train.timing_every=0"],
                                     ["train.timing_every=1"], warm, a.timeout))
    if "f" in parts and not doctor_first:
        _say(f"(f) ddp-doctor over {max(worlds)} process(es)")
        res["doctor"] = run_doctor(max(worlds), a.device, out, a.doctor_sizes)
    save()
    print("\n".join(summary_lines(res)), flush=True)
    print(f"results: {out / 'results.json'}")
    failed = [s for s in res["studies"] if s["rc"] != 0] + [r for r in res["reference"] if r.get("error")]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
