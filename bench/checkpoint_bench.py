"""Checkpoint write cost for a GPT-2-small-sized training state, on the current device.

State: 124M fp32 parameters (GPT-2 small's tensor shapes) plus AdamW ``exp_avg`` and ``exp_avg_sq``, about
1.5 GB, random values, on CUDA when available. Reports the median over ``--reps`` of:

- ``torch.save``: plain ``torch.save`` of the same state to a file in the same directory (no fsync);
- ``ckpt.save``: our atomic save (hash, fsync, rename, retention);
- ``async blocked``: how long ``AsyncSaver.save`` blocks the training thread (the snapshot to host memory);
- ``async total``: from ``AsyncSaver.save`` until the background write has finished.

Usage: ``python bench/checkpoint_bench.py [--dir D] [--reps N] [--size-mb MB]`` (``--size-mb`` shrinks the
state to flat tensors of about that total size, for a quick CPU run).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ddp_runner.tasks.engine import checkpoint as ck  # noqa: E402


def gpt2_small_shapes(vocab: int = 50257, ctx: int = 1024, d: int = 768, layers: int = 12) -> list[tuple]:
    """Parameter shapes of GPT-2 small (lm_head tied to wte): 124,439,808 parameters."""
    shapes: list[tuple] = [(vocab, d), (ctx, d)]
    for _ in range(layers):
        shapes += [(d,), (d,), (d, 3 * d), (3 * d,), (d, d), (d,),  # ln_1, attn c_attn, c_proj
                   (d,), (d,), (d, 4 * d), (4 * d,), (4 * d, d), (d,)]  # ln_2, mlp c_fc, c_proj
    return shapes + [(d,), (d,)]


def build_state(size_mb: float | None, device: torch.device) -> dict:
    """Model params + AdamW state (exp_avg, exp_avg_sq, step) as plain tensors."""
    if size_mb is None:
        shapes = gpt2_small_shapes()
    else:  # params are a third of the bytes (fp32 param, exp_avg, exp_avg_sq)
        n = max(1, int(size_mb * 2**20 / 12))
        chunk = 4 << 20
        shapes = [(chunk,)] * (n // chunk) + ([(n % chunk,)] if n % chunk else [])
    model = {f"p{i}": torch.randn(s, device=device) for i, s in enumerate(shapes)}
    optim = {i: {"step": torch.tensor(100.0), "exp_avg": torch.randn(s, device=device),
                 "exp_avg_sq": torch.rand(s, device=device)} for i, s in enumerate(shapes)}
    groups = [{"lr": 6e-4, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1,
               "params": list(range(len(shapes)))}]
    return {"model": model, "optimizer": {"state": optim, "param_groups": groups}, "step": 100}


def nbytes(obj: object) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(nbytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(nbytes(v) for v in obj)
    return 0


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", default=None, help="directory to write into (default: a new temp dir)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--size-mb", type=float, default=None, help="shrink the state to about this many MB")
    args = ap.parse_args()

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    own_base = args.dir is None
    base = Path(tempfile.mkdtemp(prefix="ckpt-bench-")) if own_base else Path(args.dir)
    base.mkdir(parents=True, exist_ok=True)
    work = base / f"ckpt-bench-{os.getpid()}"
    work.mkdir()
    state = build_state(args.size_mb, device)
    size = nbytes(state)
    sync(device)

    keys = ("torch.save", "ckpt.save", "async blocked", "async total")
    times: dict[str, list[float]] = {k: [] for k in keys}
    saver = ck.AsyncSaver()
    try:
        for rep in range(args.reps):
            t0 = time.perf_counter()
            torch.save(state, work / "plain.pt")
            times["torch.save"].append(time.perf_counter() - t0)
            (work / "plain.pt").unlink()

            t0 = time.perf_counter()
            ck.save(str(work / "sync"), rep, state, keep_last=1)
            times["ckpt.save"].append(time.perf_counter() - t0)

            t0 = time.perf_counter()
            saver.save(str(work / "async"), rep, state, keep_last=1)
            t1 = time.perf_counter()
            saver.wait()
            t2 = time.perf_counter()
            times["async blocked"].append(t1 - t0)
            times["async total"].append(t2 - t0)
        saver.close()
        # What the engine does: reserve the buffers in the background after the first optimizer step, so
        # even the first save of a run only waits for the copy.
        fresh = ck.AsyncSaver()
        fresh.reserve(state)
        fresh.wait()
        t0 = time.perf_counter()
        fresh.save(str(work / "reserved"), 0, state, keep_last=1)
        first_reserved = time.perf_counter() - t0
        fresh.close()
    finally:
        shutil.rmtree(base if own_base else work, ignore_errors=True)

    med = {k: statistics.median(v) for k, v in times.items()}
    gb = size / 1e9
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"checkpoint bench: device={device} ({name}), state={gb:.3f} GB, reps={args.reps}, dir={base}")
    print("(the first async save also allocates the reused (pinned) host buffers: "
          f"blocked {times['async blocked'][0]:.3f} s; after AsyncSaver.reserve, as the engine does: "
          f"{first_reserved:.3f} s)\n")
    print("| measure | median s | GB/s |")
    print("| --- | ---: | ---: |")
    for k, v in med.items():
        print(f"| {k} | {v:.3f} | {gb / v:.2f} |")
    print()
    print(json.dumps({"bench": "checkpoint", "device": str(device), "state_bytes": size, "reps": args.reps,
                      "median_s": {k: round(v, 4) for k, v in med.items()},
                      "all_s": {k: [round(x, 4) for x in v] for k, v in times.items()},
                      "first_save_blocked_after_reserve_s": round(first_reserved, 4)}))


if __name__ == "__main__":
    main()
