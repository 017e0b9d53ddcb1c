"""Optional torch.profiler tracing of a few optimizer steps (``train.profile.steps``), and the trace's summary.

Each rank writes ``profile/rank<R>.trace.json.gz`` (open it in Perfetto or chrome://tracing) and
``profile/rank<R>.summary.json``: device-kernel time per category per step, how much of the step the device was
busy computing, and how much communication was left exposed (not hidden behind compute). The summary is a pure
function of the trace's events, so it is tested on hand-made events.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

# First match wins; names are the kernel names CUDA reports (cuBLAS, cuDNN, flash, Triton, NCCL, PyTorch).
CATEGORIES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("communication", re.compile(r"nccl|allreduce|all_reduce|reduce_scatter|allgather", re.I)),
    ("attention", re.compile(r"flash|fmha|attention|sdpa|cudnn", re.I)),
    ("matmul", re.compile(r"gemm|cutlass|xmma|nvjet|wgmma|cublas|triton_tem|_mm_|splitk|s\d+_\w*gemm", re.I)),
    # Multi-tensor kernels: the optimizer step, clipping's norm and scale, and gradient accumulation's add.
    ("multi-tensor (optimizer, clip, accumulate)", re.compile(r"multi_tensor|adam|foreach|fused_sgd", re.I)),
    ("loss (fused cross-entropy)", re.compile(r"^ce_rows_inplace")),  # tasks/fused_ce.py's Triton kernel
    ("fused elementwise", re.compile(r"^triton_", re.I)),
    ("memory copy", re.compile(r"memcpy|memset|copy", re.I)),
)
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def categorize(name: str) -> str:
    """The category of a device kernel, from its name."""
    for cat, pattern in CATEGORIES:
        if pattern.search(name):
            return cat
    return "other"


def _merge(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """Sorted, non-overlapping intervals covering the same time as ``intervals``."""
    merged: list[list[float]] = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


def _union_length(intervals: Iterable[tuple[float, float]]) -> float:
    return sum(b - a for a, b in _merge(intervals))


def _overlap(intervals: list[tuple[float, float]], cover: list[tuple[float, float]]) -> float:
    """Length of the union of ``intervals`` that lies inside the union of ``cover``."""
    cover = _merge(cover)
    return _union_length((max(a, c), min(b, d)) for a, b in intervals for c, d in cover if max(a, c) < min(b, d))


def summarize(events: Iterable[Mapping[str, Any]], steps: int, wall_s: float) -> dict[str, Any]:
    """Per-step device time by category, busy fraction and exposed communication from Chrome-trace events.

    ``wall_s`` is the host-measured time of the ``steps`` traced steps (device synchronised at both ends).
    Times are in milliseconds per step.
    """
    per_cat: dict[str, float] = {}
    kernels: dict[str, float] = {}
    compute: list[tuple[float, float]] = []
    comm: list[tuple[float, float]] = []
    for e in events:
        if e.get("ph") != "X" or e.get("cat") not in DEVICE_CATS or "dur" not in e:
            continue
        name, a, d = str(e.get("name", "")), float(e["ts"]), float(e["dur"])
        cat = categorize(name)
        per_cat[cat] = per_cat.get(cat, 0.0) + d
        kernels[name] = kernels.get(name, 0.0) + d
        (comm if cat == "communication" else compute).append((a, a + d))
    steps = max(1, steps)
    wall_ms = 1e3 * wall_s / steps
    busy_ms = _union_length(compute) / 1e3 / steps
    comm_ms = _union_length(comm) / 1e3 / steps
    hidden_ms = _overlap(comm, compute) / 1e3 / steps
    top = sorted(kernels.items(), key=lambda kv: -kv[1])[:15]
    return {
        "steps": steps,
        "step_wall_ms": wall_ms,
        "compute_busy_ms": busy_ms,
        "compute_busy_pct": 100 * busy_ms / wall_ms if wall_ms else None,
        "communication_ms": comm_ms,
        "communication_exposed_ms": comm_ms - hidden_ms,
        "by_category_ms": {k: v / 1e3 / steps for k, v in sorted(per_cat.items(), key=lambda kv: -kv[1])},
        "top_kernels_ms": [{"name": k[:160], "category": categorize(k), "ms": v / 1e3 / steps} for k, v in top],
    }


def format_summary(s: Mapping[str, Any]) -> str:
    """A few readable lines of a :func:`summarize` result."""
    if not s["by_category_ms"]:
        return (f"profile: {s['steps']} step(s), {s['step_wall_ms']:.2f} ms/step wall; no device kernels in the trace"
                " (a CPU run): open the trace for the operator timeline")
    lines = [f"profile: {s['steps']} step(s), {s['step_wall_ms']:.2f} ms/step wall; device computing "
             f"{s['compute_busy_ms']:.2f} ms ({s['compute_busy_pct']:.1f}%); communication {s['communication_ms']:.2f}"
             f" ms, exposed {s['communication_exposed_ms']:.2f} ms"]
    width = max(map(len, s["by_category_ms"]))
    lines += [f"  {cat:<{width}} {ms:8.2f} ms/step" for cat, ms in s["by_category_ms"].items()]
    return "\n".join(lines)


class StepProfiler:
    """Traces optimizer steps ``start+1 … start+steps`` of this launch's run (``train.profile``)."""

    def __init__(self, out_dir: str, rank: int, start: int, steps: int, device: torch.device,
                 say: Callable[[str], None] | None = None) -> None:
        self.out_dir, self.rank, self.first, self.last = out_dir, rank, start + 1, start + steps
        self.device, self.say = device, say
        self.prof: torch.profiler.profile | None = None
        self.t0 = 0.0
        self.enabled = steps > 0

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def acts_before(self, step: int) -> bool:
        """Whether :meth:`before_step` starts the trace at ``step`` (it drains the device first)."""
        return self.enabled and step == self.first

    def acts_after(self, step: int) -> bool:
        """Whether :meth:`after_step` ends the trace at ``step`` (it drains the device, then writes the files)."""
        return self.prof is not None and step >= self.last

    def before_step(self, step: int) -> None:
        """Call before running optimizer step ``step`` (1-based)."""
        if not self.acts_before(step):
            return
        acts = [torch.profiler.ProfilerActivity.CPU]
        if self.device.type == "cuda":
            acts.append(torch.profiler.ProfilerActivity.CUDA)
        self._sync()
        self.prof = torch.profiler.profile(activities=acts, record_shapes=False)
        self.prof.__enter__()
        self.t0 = time.perf_counter()

    def after_step(self, step: int) -> dict[str, Any] | None:
        """Call after optimizer step ``step``; after the last traced one, writes the files and returns the summary."""
        return self.finish(step) if self.acts_after(step) else None

    def finish(self, step: int) -> dict[str, Any] | None:
        """Stop tracing at step ``step`` (training may end before the last planned one), write the files and
        report the summary through ``say``."""
        if self.prof is None:
            return None
        self._sync()
        wall = time.perf_counter() - self.t0
        self.prof.__exit__(None, None, None)
        prof, self.prof, self.enabled = self.prof, None, False
        os.makedirs(self.out_dir, exist_ok=True)
        raw = os.path.join(self.out_dir, f"rank{self.rank}.trace.json")
        prof.export_chrome_trace(raw)
        with open(raw, "rb") as f:
            data = f.read()
        with gzip.open(raw + ".gz", "wb") as g:
            g.write(data)
        os.remove(raw)
        events = json.loads(data).get("traceEvents", [])
        summary = summarize(events, step - self.first + 1, wall)
        with open(os.path.join(self.out_dir, f"rank{self.rank}.summary.json"), "w") as f:
            json.dump(summary, f, indent=2)
        if self.say is not None:
            self.say(format_summary(summary))
        return summary
