"""ddp-doctor's all-reduce bus-bandwidth measurement: one worker process per rank, a real process group (NCCL on
GPUs, gloo on CPU), nccl-tests' arithmetic, and reference figures measured on known hardware. torch is imported only
inside the workers and the measurement."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ddp_runner.contract.layout import SAFE_ENV
from ddp_runner.contract.osutil import atomic_write, die_with_parent
from ddp_runner.diagnostics.doctor.checks import FAIL, OK, WARN, Check, MiB, human_bytes

GPU_SIZES = (1 * MiB, 16 * MiB, 64 * MiB, 256 * MiB, 512 * MiB)
CPU_SIZES = (1 * MiB, 4 * MiB, 16 * MiB, 64 * MiB)


@dataclass(frozen=True)
class Reference:
    """A bus-bandwidth figure measured on known hardware, shown beside ours."""

    gpu: str  # substring of the GPU's name
    n: int  # GPUs in the all-reduce
    link: str  # what joins them (topology) — a reference holds only for that link
    size: int  # message bytes
    busbw_gbps: float
    source: str


REFERENCES = (Reference("H200", 2, "NVLink", 512 * MiB, 315.0, "2×H200 NVLink, 512 MiB all-reduce, measured"),)

def allreduce_bandwidth(nbytes: int, seconds: float, nranks: int) -> tuple[float, float]:
    """nccl-tests' all-reduce figures in GB/s (1e9 bytes): ``algbw = bytes / time``, ``busbw = algbw × 2(n−1)/n``.

    busbw is what each link carries in a ring all-reduce, so it is comparable across rank counts; with one rank
    nothing crosses a link and it is 0.
    """
    if seconds <= 0 or nranks < 1:
        raise ValueError(f"seconds={seconds}, nranks={nranks}: both must be positive")
    algbw = nbytes / seconds / 1e9
    return algbw, algbw * 2 * (nranks - 1) / nranks


def reference_for(gpu_name: str | None, nranks: int, nbytes: int, topology: dict[str, Any] | None) -> Reference | None:
    """The known figure for this hardware and size, if any. A reference made on NVLink holds only where the
    topology shows NVLink or is not visible (then it is shown as what that hardware should reach)."""
    for ref in REFERENCES:
        if gpu_name and ref.gpu in gpu_name and ref.n == nranks and ref.size == nbytes:
            if ref.link == "NVLink" and topology and topology.get("links") and not topology.get("nvlink_all_pairs"):
                continue
            return ref
    return None


def bench_env(environ: dict[str, str] | os._Environ[str] | None = None) -> dict[str, str]:
    """What the workers add to their environment: NVLink multicast off (``launch.SAFE_ENV``) unless set already."""
    env = os.environ if environ is None else environ
    return {k: v for k, v in SAFE_ENV.items() if k not in env}


def _bench_worker(rank: int, nranks: int, init_file: str, out: str, backend: str, sizes: Sequence[int],
                  warmup: int, iters: int, budget_s: float, env: dict[str, str]) -> None:
    """One rank: all-reduce each size ``warmup`` times, then time up to ``iters`` (fewer when one op is slow, so a
    CPU run stays short); rank 0 writes the slowest rank's mean time per size to ``out``."""
    die_with_parent()
    os.environ.update(env)  # before NCCL reads its variables at communicator creation
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=nranks,
                            timeout=timedelta(seconds=60), device_id=device if device.type == "cuda" else None)

    try:
        _slowest(device, 0.0)  # the first collective sets up the communicator: keep that out of the warm-up timing
        rows = [_measure_size(size, device, nranks, warmup, iters, budget_s) for size in sizes]
        if rank == 0:  # with the variables the measurement ran under (NVLink multicast off, …)
            seen = {k: os.environ[k] for k in sorted(os.environ) if k.startswith(("NCCL_", "NVSHMEM_", "TORCH_"))}
            atomic_write(out, json.dumps({"backend": backend, "nranks": nranks, "rows": rows, "env": seen}))
    finally:
        dist.destroy_process_group()


def _measure_size(size: int, device: Any, nranks: int, warmup: int, iters: int, budget_s: float) -> dict[str, Any]:
    """One size's row: warm up, choose how many all-reduces fit the time budget, time them (the slowest rank's)."""
    import torch
    import torch.distributed as dist

    x = torch.zeros(max(1, size // 4), dtype=torch.float32, device=device)
    nbytes = x.numel() * 4
    t0 = time.perf_counter()
    for _ in range(warmup):
        dist.all_reduce(x)
    _sync(device)
    per_op = _slowest(device, (time.perf_counter() - t0) / max(1, warmup))
    count = max(3, min(iters, int(budget_s / max(per_op, 1e-9))))
    _slowest(device, 0.0)  # lines the ranks up before the clock starts
    t0 = time.perf_counter()
    for _ in range(count):
        dist.all_reduce(x)
    _sync(device)
    seconds = _slowest(device, (time.perf_counter() - t0) / count)
    algbw, busbw = allreduce_bandwidth(nbytes, seconds, nranks)
    return {"bytes": nbytes, "iters": count, "time_us": seconds * 1e6, "algbw_gbps": algbw, "busbw_gbps": busbw}


def _sync(device: Any) -> None:
    """Wait for the GPU's queued work (nothing to wait for on CPU)."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _slowest(device: Any, seconds: float) -> float:
    """The slowest rank's ``seconds``: every rank must agree on counts and report the slowest rank's time."""
    import torch
    import torch.distributed as dist

    t = torch.tensor([seconds], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def measure_bandwidth(device: str, nproc: int, sizes: Sequence[int], warmup: int, iters: int,
                      timeout_s: float) -> dict[str, Any]:
    """Start ``nproc`` real processes with a real process group (NCCL on GPUs, gloo on CPU) and time all-reduces.

    Returns rank 0's result; raises RuntimeError naming the cause when the group or a collective fails or hangs.
    The workers are spawned, never forked: a fork of a process whose torch has started threads can deadlock in
    the child (seen: gloo workers forked from a process that had run other torch work hung), and CUDA cannot be
    forked once initialised.
    """
    import torch.multiprocessing as mp
    from torch.multiprocessing.spawn import ProcessException

    backend = "nccl" if device == "cuda" else "gloo"
    budget = 1.0 if device == "cuda" else 0.4  # seconds of timed all-reduces per size, at most
    with tempfile.TemporaryDirectory(prefix="ddp-doctor-") as tmp:
        out = os.path.join(tmp, "bandwidth.json")
        args = (nproc, os.path.join(tmp, "store"), out, backend, list(sizes), warmup, iters, budget, bench_env())
        # spawn pickles the worker by its module's name: this module is never __main__ (``python -m`` runs the
        # package's __main__.py), so the children find it there
        with _env_added(args[-1]):  # in the workers' environment from their first instruction
            ctx = mp.start_processes(_bench_worker, args=args, nprocs=nproc, join=False, start_method="spawn")
        deadline = time.monotonic() + timeout_s
        try:
            while not ctx.join(timeout=max(0.0, min(1.0, deadline - time.monotonic())), grace_period=1.0):
                if time.monotonic() >= deadline:
                    raise RuntimeError(f"all-reduce did not finish in {timeout_s:.0f} s: a hang (rerun with "
                                       "NCCL_DEBUG=INFO to see where it stops)")
        except ProcessException as e:
            raise RuntimeError(f"rank {e.error_index} failed: {_last_line(str(e))}\n{e}") from None
        finally:
            for p in ctx.processes:  # ours: the workers this call started, stopped by their own handles
                if p.is_alive():
                    p.kill()
                    p.join(5)
        if not os.path.exists(out):
            raise RuntimeError("the workers ended without a result")
        with open(out) as f:
            return json.load(f)


@contextlib.contextmanager
def _env_added(env: dict[str, str]) -> Iterator[None]:
    """Set ``env`` in this process's environment for the block (children started in it inherit it)."""
    os.environ.update(env)
    try:
        yield
    finally:
        for k in env:
            os.environ.pop(k, None)


def _last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1].strip() if lines else text


def bandwidth_check(device: str, nproc: int, sizes: Sequence[int], gpu_name: str | None,
                    topology: dict[str, Any] | None, timeout_s: float) -> Check:
    """Measure, attach the reference figure where one is known, and judge."""
    warmup, iters = (5, 20) if device == "cuda" else (2, 10)
    where = f"NCCL on {nproc} GPUs" if device == "cuda" else f"gloo on {nproc} CPU processes"
    t0 = time.perf_counter()
    try:
        result = measure_bandwidth(device, nproc, sizes, warmup, iters, timeout_s)
    except RuntimeError as e:
        msg = str(e)
        return Check("bandwidth", FAIL, f"{where}: {msg.splitlines()[0]}", {"error": msg, "device": device})
    result["seconds"] = round(time.perf_counter() - t0, 2)
    result["device"] = device
    status, note = OK, "no reference figure"
    for row in result["rows"]:
        ref = reference_for(gpu_name, result["nranks"], row["bytes"], topology) if device == "cuda" else None
        row["reference_busbw_gbps"] = ref.busbw_gbps if ref else None
        if ref:
            note = f"expected about {ref.busbw_gbps:.0f} GB/s at {human_bytes(ref.size)} ({ref.source})"
            if row["busbw_gbps"] < 0.5 * ref.busbw_gbps:
                status = WARN
                note += ": under half of it"
    best = max(result["rows"], key=lambda r: r["bytes"])
    if best["busbw_gbps"] <= 0:
        status = FAIL
    return Check("bandwidth", status, f"{where}: busbw {best['busbw_gbps']:.2f} GB/s at {human_bytes(best['bytes'])}"
                 f" ({note})", result)

