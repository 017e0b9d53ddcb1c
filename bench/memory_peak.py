"""Where rank 0's peak CUDA memory goes (issue 18, the memory planner's calibration), for one ``ddp-run``.

Runs ``python -m ddp_runner <overrides>`` with ``bench/memsnap`` on PYTHONPATH: rank 0's worker records the CUDA
allocator's history (``torch.cuda.memory._record_memory_history``) and writes the snapshot at exit. The history
is then replayed: the moment of the most allocated bytes, and the blocks alive then, grouped by the innermost
frame of this project's code and the innermost frame of all (compiled graphs show as inductor's generated
``call``). Prints and writes JSON: the peak, the groups (GiB, largest first), the run's ``memory/peak_gb`` and
its planner estimate.

Usage: python bench/memory_peak.py --out peak.json -- task=gpt2_small world_size=2 strategy=fsdp ...
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

GIB = 2**30
HERE = Path(__file__).resolve().parent
ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
PROJECT = ("/tasks/", "/runner/")


def _label(frame: dict[str, Any]) -> str:
    name = frame.get("filename", "?")
    if "torchinductor" in name or "/.compile_cache/" in name:
        name = "<compiled graph>"
    else:
        for marker in ("/site-packages/", "/dist-packages/", "/work/", "/root/"):
            if marker in name:
                name = name.split(marker, 1)[1]
    return f"{name}:{frame.get('line')} {frame.get('name')}"


def group_of(frames: list[dict[str, Any]]) -> str:
    """A live block's group: the innermost frame of this project and the innermost frame of all."""
    if not frames:
        return "(no Python frame: autograd engine or C++)"
    own = next((f for f in frames if any(p in f.get("filename", "") for p in PROJECT)), None)
    inner = _label(frames[0])
    return inner if own is None or own is frames[0] else f"{_label(own)} <- {inner}"


def peak(trace: list[dict[str, Any]]) -> dict[str, Any]:
    """Replay an allocator trace: the most bytes allocated at once, and the live blocks then, by group."""
    live: dict[int, int] = {}
    cur = best = best_at = 0
    for i, e in enumerate(trace):
        a = e.get("action")
        if a == "alloc":
            live[e["addr"]] = e["size"]
            cur += e["size"]
            if cur > best:
                best, best_at = cur, i
        elif a in ("free_requested", "free_completed") and e["addr"] in live:
            cur -= live.pop(e["addr"])
    blocks: dict[int, dict[str, Any]] = {}
    for e in trace[:best_at + 1]:
        a = e.get("action")
        if a == "alloc":
            blocks[e["addr"]] = e
        elif a in ("free_requested", "free_completed"):
            blocks.pop(e["addr"], None)
    groups: dict[str, list[int]] = {}
    for e in blocks.values():
        g = groups.setdefault(group_of(e.get("frames") or []), [0, 0])
        g[0] += e["size"]
        g[1] += 1
    ranked = sorted(groups.items(), key=lambda kv: -kv[1][0])
    return {"peak_gb": best / GIB, "events": len(trace), "peak_event": best_at,
            "groups": [{"gb": round(b / GIB, 4), "blocks": n, "where": k} for k, (b, n) in ranked[:300]]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="memory_peak.json")
    ap.add_argument("overrides", nargs="*")
    a = ap.parse_args()
    snap_dir = tempfile.mkdtemp(prefix="memsnap_")
    root = tempfile.mkdtemp(prefix="memory_peak_")
    env = {**os.environ, **ENV, "DDP_BENCH_MEMSNAP": snap_dir,
           "PYTHONPATH": os.pathsep.join(p for p in (str(HERE / "memsnap"), os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.run([sys.executable, "-m", "ddp_runner", *a.overrides, f"output.root={root}"], env=env,
                          capture_output=True, text=True, timeout=900)
    out: dict[str, Any] = {"overrides": a.overrides, "rc": proc.returncode}
    if proc.returncode != 0:
        out["tail"] = (proc.stdout + proc.stderr)[-3000:]
    else:
        run_dir = Path(proc.stdout.strip().splitlines()[-1])
        s = json.loads((run_dir / "summary.json").read_text())
        m = json.loads((run_dir / "run.json").read_text())
        mp = m.get("memory_plan") or {}
        out["reported_peak_gb"] = s["final"].get("memory/peak_gb")
        out["estimate"] = (mp.get("estimates") or {}).get(mp.get("strategy"))
        out["tok_s"] = s["median"].get("tokens_per_s")
    snap = Path(snap_dir) / "rank0.pickle"
    if snap.exists():
        with open(snap, "rb") as f:
            snapshot = pickle.load(f)
        traces = [t for t in snapshot.get("device_traces", []) if t]
        out["replay"] = peak(traces[0]) if traces else None
    print(json.dumps(out, indent=1))
    Path(a.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
