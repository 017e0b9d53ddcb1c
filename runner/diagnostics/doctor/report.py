"""ddp-doctor's reports: the cheap one every run stores in run.json, the full one the command prints, and its
table."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any

from ddp_runner.config.plan import Gpu
from ddp_runner.contract import textfit
from ddp_runner.diagnostics.doctor.bandwidth import CPU_SIZES, GPU_SIZES, bandwidth_check
from ddp_runner.diagnostics.doctor.checks import (
    FAIL,
    SKIPPED,
    Check,
    env_check,
    host_check,
    human_bytes,
    overall,
    shm_check,
    torch_checks,
)
from ddp_runner.diagnostics.doctor.gpus import devices_check, topology_check, visible_check


def _report(checks: Sequence[Check]) -> dict[str, Any]:
    return {"status": overall(checks), "checks": [asdict(c) for c in checks]}


def cheap_report(gpu: bool = False, host_gpus: Sequence[Gpu] | None = None) -> dict[str, Any]:
    """The checks cheap enough for every run, for run.json: host, /dev/shm, environment, and — only when ``gpu``
    (a GPU run is planned) — nvidia-smi's devices, topology and the visible-device mapping.

    Never imports torch and measures nothing; its subprocesses are nvidia-smi alone (each well under 0.1 s on a
    2×H200 host), and only with ``gpu``. ``host_gpus``: every GPU of the host as
    ``ddp_runner.config.devices.all_gpus()`` returns it, when the caller has it already (saves one nvidia-smi call).
    Returns ``{"status": ok|warn|fail, "checks": [{"name", "status", "summary", "data"}, ...]}``, JSON-ready.
    """
    checks = [host_check(), shm_check(), env_check(os.environ, gpu=gpu)]
    if gpu:
        checks += [devices_check(), topology_check(), visible_check(host_gpus)]
    else:
        checks.append(Check("visible devices", SKIPPED, "no GPU run planned",
                            {"CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES")}))
    return _report(checks)


def full_report(bandwidth: bool = True, device: str = "auto", nproc: int | None = None,
                sizes: Sequence[int] | None = None, timeout_s: float = 120.0,
                progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Every check, the bandwidth measurement included unless ``bandwidth`` is False."""
    say = progress or (lambda _msg: None)
    say("devices and topology (nvidia-smi)")
    devices = devices_check()
    topology = topology_check()
    visible = visible_check()
    nvisible = len(visible.data["mapping"])
    checks = [devices, topology, visible]
    say("torch, NCCL, gloo")
    checks += torch_checks(nvisible if devices.data.get("driver") else None)
    cuda_count = next((c.data.get("device_count", 0) for c in checks if c.name == "torch"), 0)
    has_gpu = bool(devices.data.get("gpus")) or cuda_count > 0  # no GPU: no NCCL variables, no NCCL advice
    checks += [shm_check(), env_check(os.environ, gpu=has_gpu), host_check()]
    if not bandwidth:
        checks.append(Check("bandwidth", SKIPPED, "--no-bandwidth"))
        return _report(checks)
    use = device if device != "auto" else ("cuda" if cuda_count >= 2 else "cpu")
    if use == "cuda" and cuda_count < 2:
        checks.append(Check("bandwidth", SKIPPED if cuda_count == 1 else FAIL,
                            f"{cuda_count} CUDA device(s): an all-reduce needs at least 2"))
        return _report(checks)
    n = nproc or (cuda_count if use == "cuda" else 2)
    if use == "cuda" and n > cuda_count:
        checks.append(Check("bandwidth", FAIL, f"--nproc {n}: only {cuda_count} CUDA devices (one process a GPU)"))
        return _report(checks)
    gpu_name = visible.data["mapping"][0]["name"] if visible.data["mapping"] else None
    say(f"all-reduce bandwidth ({'NCCL' if use == 'cuda' else 'gloo'}, {n} processes)")
    checks.append(bandwidth_check(use, n, sizes or (GPU_SIZES if use == "cuda" else CPU_SIZES), gpu_name,
                                  topology.data if topology.data.get("visible") else None, timeout_s))
    return _report(checks)


def render(report: dict[str, Any], width: int | None = None) -> str:
    """The report as a plain aligned table, then the mapping, bandwidth and environment details, fitted to ``width``
    columns (None: lines whole): an explanation continues under its column."""
    checks = report["checks"]
    w = max(len(c["name"]) for c in checks)
    lines = ["ddp-doctor: preflight checks for multi-GPU training", "",
             f"{'CHECK':<{w}}  {'STATUS':<7}  EXPLANATION"]
    lines += [part for c in checks for part in textfit.wrap(
        f"{c['name']:<{w}}  {c['status'].upper() if c['status'] == FAIL else c['status']:<7}  {c['summary']}",
        width, under=w + 11)]  # an explanation continues under its column
    by = {c["name"]: c for c in checks}
    mapping = by.get("visible devices", {}).get("data", {}).get("mapping")
    if mapping:
        lines += ["", "local rank → physical GPU"]
        lines += [f"  {m['local_rank']:>3} → GPU{m['physical_index']}  {m['name']}  {m['uuid']}" for m in mapping]
    links = by.get("topology", {}).get("data", {}).get("links")
    if links:
        lines += ["", "GPU links (nvidia-smi topo -m)"] + [f"  {k}: {v}" for k, v in links.items()]
    rows = by.get("bandwidth", {}).get("data", {}).get("rows")
    if rows:
        d = by["bandwidth"]["data"]
        lines += ["", f"all-reduce, {d['backend']}, {d['nranks']} ranks (busbw = algbw × 2(n−1)/n, GB/s = 1e9 B/s)",
                  f"  {'size':>8}  {'iters':>5}  {'time (us)':>10}  {'algbw':>8}  {'busbw':>8}  expected busbw"]
        for r in rows:
            ref = f"{r['reference_busbw_gbps']:.0f}" if r.get("reference_busbw_gbps") else "no reference figure"
            lines.append(f"  {human_bytes(r['bytes']):>8}  {r['iters']:>5}  {r['time_us']:>10.1f}  "
                         f"{r['algbw_gbps']:>8.2f}  {r['busbw_gbps']:>8.2f}  {ref}")
    env = by.get("environment", {}).get("data", {})
    if env.get("variables") or env.get("added_for_workers"):
        lines += ["", "environment"]
        lines += [f"  {k}={v}" for k, v in env.get("variables", {}).items()]
        lines += [f"  {k}={v}  (added by ddp-run for workers)" for k, v in env.get("added_for_workers", {}).items()]
    lines += ["", f"overall: {report['status']}"]
    return "\n".join(textfit.wrap_all(lines, width))

