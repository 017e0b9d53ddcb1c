"""ddp-doctor: the seed's prerequisite checks for multi-GPU training, as one command.

Devices (``nvidia-smi -L``), topology (``nvidia-smi topo -m``), the visible-device mapping (local rank → physical
GPU), torch's view (device count, NCCL, gloo), ``/dev/shm``, the NCCL_*/TORCH_*/CUDA_* variables in effect, and a
short all-reduce bus-bandwidth measurement in real processes with a real process group (NCCL on GPUs, gloo on CPU).

Every check has a status (ok / warn / fail / skipped) and a one-line explanation; the exit code is 1 when any
check fails. :func:`cheap_report` is the part cheap enough for every run (no torch import, no bandwidth): the
driver stores it in run.json.

torch is imported only inside the torch checks and the bandwidth measurement, so the driver can import this
module for :func:`cheap_report` at no cost.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ddp_runner.config.devices import all_gpus, select_visible
from ddp_runner.config.plan import Gpu
from ddp_runner.contract.layout import SAFE_ENV
from ddp_runner.contract.osutil import atomic_write, die_with_parent

OK, WARN, FAIL, SKIPPED = "ok", "warn", "fail", "skipped"
_SEVERITY = {SKIPPED: 0, OK: 0, WARN: 1, FAIL: 2}

MiB = 1 << 20
GiB = 1 << 30
SHM_MIN_BYTES = 1 * GiB  # DataLoader workers pass batches through /dev/shm and NCCL keeps its buffers there
GPU_SIZES = (1 * MiB, 16 * MiB, 64 * MiB, 256 * MiB, 512 * MiB)
CPU_SIZES = (1 * MiB, 4 * MiB, 16 * MiB, 64 * MiB)
ENV_PREFIXES = ("NCCL_", "TORCH_", "CUDA_", "NVSHMEM_")
# Variables that switch an NCCL transport off: the seed warns against disabling transports to silence a timeout.
TRANSPORT_OFF = ("NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE", "NCCL_IB_DISABLE", "NCCL_NVLS_ENABLE")
SMI_TIMEOUT_S = 10.0


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


@dataclass
class Check:
    """One check's outcome: ``summary`` is the one line a human reads, ``data`` what a program reads."""

    name: str
    status: str
    summary: str
    data: dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------------------------
# Pure parts: parsing and arithmetic (tested directly)
# ---------------------------------------------------------------------------------------------------------------

_SMI_L = re.compile(r"^GPU (\d+): (.+?) \(UUID: ([^)]+)\)\s*$")
_SMI_MIG = re.compile(r"^\s+MIG (.+?)\s+Device\s+(\d+): \(UUID: ([^)]+)\)\s*$")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def parse_smi_list(text: str) -> list[dict[str, Any]]:
    """``nvidia-smi -L`` → ``[{"index", "name", "uuid", "mig": [...]}]`` (MIG instances under their GPU)."""
    gpus: list[dict[str, Any]] = []
    for line in text.splitlines():
        m = _SMI_L.match(line.strip())
        if m:
            gpus.append({"index": int(m.group(1)), "name": m.group(2), "uuid": m.group(3), "mig": []})
            continue
        m = _SMI_MIG.match(line)
        if m and gpus:
            gpus[-1]["mig"].append({"profile": m.group(1), "device": int(m.group(2)), "uuid": m.group(3)})
    return gpus


def parse_topology(text: str) -> dict[str, Any]:
    """``nvidia-smi topo -m`` → the GPU-to-GPU link matrix.

    Returns ``{"gpus": ["GPU0", ...], "links": {"GPU0-GPU1": "NV18", ...}, "nvlink_all_pairs": bool}``; raises
    ValueError when the text holds no matrix (restricted output).
    """
    lines = [_ANSI.sub("", ln).rstrip() for ln in text.splitlines()]
    header = next((ln.split() for ln in lines if re.match(r"^\s+GPU\d+", ln)), None)
    if not header:
        raise ValueError("no GPU matrix in nvidia-smi topo -m output")
    gpu_cols = [h for h in header if re.fullmatch(r"GPU\d+", h)]
    col_of = {h: i for i, h in enumerate(header)}
    links: dict[str, str] = {}
    for ln in lines:
        cells = ln.split()
        if not cells or not re.fullmatch(r"GPU\d+", cells[0]) or cells[0] not in gpu_cols:
            continue
        row = cells[1:]
        for other in gpu_cols:
            i = col_of[other]
            if other != cells[0] and i < len(row) and gpu_cols.index(cells[0]) < gpu_cols.index(other):
                links[f"{cells[0]}-{other}"] = row[i]
    nvlink = bool(links) and all(v.startswith("NV") for v in links.values())
    return {"gpus": gpu_cols, "links": links, "nvlink_all_pairs": nvlink}


def parse_size(text: str) -> int:
    """``"512M"``, ``"4MB"``, ``"1G"``, ``"65536"`` → bytes (binary units, as nccl-tests' ``-b``/``-e``)."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)i?B?\s*", text, re.I)
    if not m:
        raise ValueError(f"size {text!r}: expected a number with an optional K/M/G suffix, e.g. 64M")
    value = int(m.group(1)) * {"": 1, "K": 1 << 10, "M": MiB, "G": GiB}[m.group(2).upper()]
    if value < 4:
        raise ValueError(f"size {text!r}: at least 4 bytes (one float32)")
    return value


def human_bytes(n: int) -> str:
    """1048576 → ``"1 MiB"`` (the sizes this module uses are whole KiB/MiB/GiB)."""
    for unit, scale in (("GiB", GiB), ("MiB", MiB), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


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


def visible_mapping(gpus: Sequence[Gpu], visible: str | None) -> tuple[str, str, list[dict[str, Any]]]:
    """Apply CUDA_VISIBLE_DEVICES (CUDA's rules, via :func:`ddp_runner.config.devices.select_visible`) and judge it.

    Returns ``(status, summary, mapping)`` where mapping lists ``{"local_rank", "physical_index", "name", "uuid"}``.
    An entry that names no GPU, or repeats one, is a failure: CUDA silently stops at it, so fewer GPUs are
    visible than the variable lists.
    """
    chosen = select_visible(list(gpus), visible)
    mapping = [{"local_rank": i, "physical_index": g.physical_index, "name": g.name, "uuid": g.uuid}
               for i, g in enumerate(chosen)]
    arrow = ", ".join(f"{m['local_rank']}→GPU{m['physical_index']}" for m in mapping)
    if not gpus:
        if visible is None:
            return SKIPPED, "no GPUs on this host (CUDA_VISIBLE_DEVICES unset)", mapping
        return WARN, f"CUDA_VISIBLE_DEVICES={visible!r} is set but this host shows no GPU (no driver)", mapping
    if visible is None:
        return OK, f"CUDA_VISIBLE_DEVICES unset: all {len(gpus)} visible, local rank {arrow}", mapping
    listed = []
    for entry in (e.strip() for e in visible.split(",")):
        if not entry or re.fullmatch(r"-\d+", entry):
            break  # an empty or negative entry ends the list on purpose ("-1" is the usual way to hide all GPUs)
        listed.append(entry)
    if not listed:
        return WARN, "CUDA_VISIBLE_DEVICES is empty: it hides every GPU (CPU-only run)", mapping
    if len(chosen) < len(listed):
        bad = listed[len(chosen)]
        if bad.startswith("MIG-"):
            return WARN, f"CUDA_VISIBLE_DEVICES names MIG instance {bad}: mapping not resolved here", mapping
        known = ", ".join(str(g.physical_index) for g in gpus)
        why = "repeats a device" if bad in listed[: len(chosen)] or _names_chosen(bad, chosen) else \
            f"names no GPU on this host (indices {known})"
        seen = f"only {len(chosen)} visible ({arrow})" if chosen else "no GPU visible"
        return FAIL, f"CUDA_VISIBLE_DEVICES={visible!r}: entry {bad!r} {why}; CUDA stops there, so {seen}", mapping
    return OK, f"CUDA_VISIBLE_DEVICES={visible!r}: local rank {arrow}", mapping


def _names_chosen(entry: str, chosen: Sequence[Gpu]) -> bool:
    return any((entry.isdigit() and g.physical_index == int(entry)) or g.uuid.startswith(entry)
               or g.uuid.startswith("GPU-" + entry) for g in chosen)


def shm_check(path: str = "/dev/shm", minimum: int = SHM_MIN_BYTES) -> Check:
    """Size and free space of the shared-memory filesystem (``os.statvfs``)."""
    try:
        st = os.statvfs(path)
    except OSError as e:
        return Check("/dev/shm", WARN, f"{path} not readable ({e.strerror}): DataLoader workers and NCCL use it")
    size, free = st.f_frsize * st.f_blocks, st.f_frsize * st.f_bavail
    data = {"path": path, "size_bytes": size, "free_bytes": free}
    text = f"{size / GiB:.1f} GiB, {free / GiB:.1f} GiB free"
    if size < minimum or free < minimum:
        return Check("/dev/shm", WARN, f"{text}: under {human_bytes(minimum)}; DataLoader workers and NCCL use it "
                     "(docker: --shm-size=16g or --ipc=host)", data)
    return Check("/dev/shm", OK, text, data)


def env_check(environ: dict[str, str] | os._Environ[str], gpu: bool = True) -> Check:
    """The NCCL_*, TORCH_*, CUDA_*, NVSHMEM_* variables in effect, and those ddp-run adds for its workers.

    ``gpu``: the host has GPUs (or a GPU run is planned). Without, nothing uses NCCL: its variables, the ones
    ddp-run adds for it and any advice about them are left out (TORCH_* and CUDA_* are still listed).
    """
    found = {k: v for k, v in sorted(environ.items()) if k.startswith(ENV_PREFIXES if gpu else ("TORCH_", "CUDA_"))}
    added = {k: v for k, v in SAFE_ENV.items() if k not in environ} if gpu else {}
    data = {"variables": found, "added_for_workers": added}
    problems = []
    off = [f"{k}={found[k]}" for k in TRANSPORT_OFF if k in found and k != "NCCL_NVLS_ENABLE" and found[k] != "0"]
    if off:
        problems.append(f"{', '.join(off)} switches an NCCL transport off (slower; hides the real cause of a hang)")
    for k, safe in SAFE_ENV.items():
        if gpu and k in found and found[k] != safe:
            problems.append(f"{k}={found[k]} turns NVLink multicast on (can take shared GPUs out of service)")
    if found.get("NCCL_DEBUG", "").upper() in ("INFO", "TRACE"):
        problems.append("NCCL_DEBUG is on: logs show topology and network details, keep them private")
    names = ", ".join(found) if found else "none set"
    if problems:
        return Check("environment", WARN, "; ".join(problems), data)
    if found or not added:
        return Check("environment", OK, f"{len(found)} set ({names})" if found else "none set", data)
    return Check("environment", OK, "none set; ddp-run adds " + ", ".join(f"{k}={v}" for k, v in added.items()),
                 data)


def overall(checks: Sequence[Check]) -> str:
    """The worst status: fail > warn > ok (skipped counts as ok)."""
    worst = max((_SEVERITY[c.status] for c in checks), default=0)
    return {0: OK, 1: WARN, 2: FAIL}[worst]


# ---------------------------------------------------------------------------------------------------------------
# Checks that look at the machine
# ---------------------------------------------------------------------------------------------------------------


def _smi(args: list[str]) -> subprocess.CompletedProcess[str] | str:
    """Run nvidia-smi; an error string when it is absent or cannot run."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return "no NVIDIA driver found (nvidia-smi is not on PATH)"
    try:
        return subprocess.run([smi, *args], capture_output=True, text=True, timeout=SMI_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"nvidia-smi {' '.join(args)} took over {SMI_TIMEOUT_S:.0f} s"
    except OSError as e:
        return f"nvidia-smi could not run: {e}"


def _first_line(text: str) -> str:
    return next((ln.strip() for ln in text.splitlines() if ln.strip()), "")


def devices_check() -> Check:
    """``nvidia-smi -L``: the GPUs the driver shows (all of them: nvidia-smi ignores CUDA_VISIBLE_DEVICES)."""
    out = _smi(["-L"])
    if isinstance(out, str):
        return Check("devices", SKIPPED if "no NVIDIA driver" in out else FAIL, out, {"driver": False, "gpus": []})
    if out.returncode != 0:
        return Check("devices", FAIL, f"nvidia-smi -L failed (exit {out.returncode}): "
                     f"{_first_line(out.stderr or out.stdout)}", {"driver": True, "gpus": []})
    gpus = parse_smi_list(out.stdout)
    if not gpus:
        return Check("devices", FAIL, "nvidia-smi -L lists no GPU", {"driver": True, "gpus": []})
    names = sorted({g["name"] for g in gpus})
    return Check("devices", OK, f"{len(gpus)} × {' / '.join(names)}", {"driver": True, "gpus": gpus})


def topology_check() -> Check:
    """``nvidia-smi topo -m``; where it is restricted or fails the topology is "not visible", never "absent"
    (containers and VMs often hide it: hidden telemetry says nothing about the hardware)."""
    out = _smi(["topo", "-m"])
    if isinstance(out, str):
        return Check("topology", SKIPPED, f"not visible: {out}", {"visible": False})
    if out.returncode != 0:
        why = _first_line(out.stderr or out.stdout) or f"exit {out.returncode}"
        return Check("topology", WARN, f"not visible here ({why}); does not mean the GPUs lack NVLink: check the "
                     "offering's documentation", {"visible": False})
    try:
        topo = parse_topology(out.stdout)
    except ValueError:
        return Check("topology", WARN, "not visible here (nvidia-smi topo -m shows no matrix); does not mean the "
                     "GPUs lack NVLink", {"visible": False, "raw": out.stdout[-2000:]})
    topo["visible"] = True
    if not topo["links"]:
        return Check("topology", OK, f"{len(topo['gpus'])} GPU: no GPU-to-GPU link to show", topo)
    kinds = sorted(set(topo["links"].values()))
    how = "NVLink between every pair" if topo["nvlink_all_pairs"] else "not all pairs on NVLink"
    return Check("topology", OK, f"{how} ({', '.join(kinds)})", topo)


def visible_check(gpus: Sequence[Gpu] | None = None, environ: dict[str, str] | None = None) -> Check:
    """CUDA_VISIBLE_DEVICES and the local-rank → physical-GPU mapping (``config.devices``, which asks nvidia-smi)."""
    env = os.environ if environ is None else environ
    host = all_gpus() if gpus is None else list(gpus)
    visible = env.get("CUDA_VISIBLE_DEVICES")
    status, summary, mapping = visible_mapping(host, visible)
    return Check("visible devices", status, summary, {"CUDA_VISIBLE_DEVICES": visible, "mapping": mapping})


def host_check() -> Check:
    """Python and torch versions and torch's build (from its package metadata: no import) and the CPUs this
    process may use."""
    try:
        torch_version = importlib.metadata.version("torch")
        build = torch_build(torch_version, importlib.metadata.requires("torch") or [])
    except importlib.metadata.PackageNotFoundError:
        torch_version = build = None
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    data = {"python": platform.python_version(), "torch": torch_version, "torch_build": build, "cpus": cpus,
            "host": platform.node(), "platform": platform.platform()}
    text = (f"python {data['python']}, torch {torch_version or 'not installed'}"
            + (f" ({build} build)" if build else "") + f", {cpus} CPUs")
    return Check("host", OK if torch_version else FAIL, text if torch_version else text + ": install torch", data)


# pip's torch from PyPI is the CUDA build on Linux; on a host without a GPU it brings 2 GB+ of CUDA libraries that
# nothing uses. README's pip path says the same.
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
GPU_BUILD_WITHOUT_GPU = ("a CUDA build on a host without an NVIDIA GPU: its CUDA libraries (2 GB+) go unused; the CPU "
                         f"build is enough (pip install torch --index-url {CPU_INDEX}, before ddp-runner)")


def torch_build(version: str, requires: Sequence[str]) -> str:
    """Which build of torch its package metadata describes: ``CPU``, ``CUDA 12.8`` (a ``+cu128`` wheel), ``CUDA``
    (PyPI's own Linux wheel, which requires NVIDIA's CUDA packages) or ``ROCm 6.2``."""
    local = version.partition("+")[2]
    if local == "cpu" or local.startswith("cpu."):
        return "CPU"
    if m := re.fullmatch(r"cu(\d+)(\d)", local):
        return f"CUDA {m.group(1)}.{m.group(2)}"
    if local.startswith("rocm"):
        return f"ROCm {local[4:]}"
    return "CUDA" if any(r.lower().startswith("nvidia-") for r in requires) else "CPU"


def torch_checks(visible_count: int | None) -> list[Check]:
    """torch's own view: its build, CUDA device count, NCCL (and its version), gloo. Imports torch.
    ``visible_count``: the GPUs nvidia-smi shows, None where there is no NVIDIA driver."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError as e:
        return [Check("torch", FAIL, f"torch does not import: {e}")]
    cuda = torch.cuda.is_available()
    count = torch.cuda.device_count()
    build = (f"CUDA {torch.version.cuda}" if torch.version.cuda
             else f"ROCm {torch.version.hip}" if getattr(torch.version, "hip", None) else "CPU")
    data = {"version": torch.__version__, "build": build, "cuda_build": torch.version.cuda, "cuda_available": cuda,
            "device_count": count}
    text = f"torch {torch.__version__}, the {build} build, {count} CUDA devices"
    status = OK
    if torch.version.cuda and not cuda and visible_count is None:
        status, text = WARN, text + "; " + GPU_BUILD_WITHOUT_GPU
    if visible_count is not None and visible_count != count:
        status = WARN
        text += f"; nvidia-smi with CUDA_VISIBLE_DEVICES shows {visible_count}: ddp-run uses torch's count"
    checks = [Check("torch", status, text, data)]

    nccl_ok = dist.is_available() and dist.is_nccl_available()
    nccl_version = None
    if nccl_ok and cuda:
        try:
            v = torch.cuda.nccl.version()
            nccl_version = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
        except (RuntimeError, AttributeError):
            pass
    ndata = {"available": nccl_ok, "version": nccl_version}
    if nccl_ok and cuda:
        checks.append(Check("nccl", OK, f"NCCL {nccl_version or '(version unknown)'}", ndata))
    elif nccl_ok:
        checks.append(Check("nccl", SKIPPED, "not used: no CUDA device on this host (CPU runs use gloo)", ndata))
    elif cuda:
        checks.append(Check("nccl", FAIL, "CUDA devices but this torch has no NCCL: multi-GPU DDP will not run", ndata))
    else:
        checks.append(Check("nccl", SKIPPED, "not in this torch build (CPU runs use gloo)", ndata))

    gloo = dist.is_available() and dist.is_gloo_available()
    checks.append(Check("gloo", OK if gloo else FAIL, "available (CPU runs)" if gloo else
                        "not in this torch build: CPU runs cannot form a process group", {"available": gloo}))
    return checks


# ---------------------------------------------------------------------------------------------------------------
# Bandwidth: one worker process per rank, a real process group, nccl-tests' arithmetic
# ---------------------------------------------------------------------------------------------------------------


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

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def slowest(seconds: float) -> float:  # every rank must agree on counts and report the slowest rank's time
        t = torch.tensor([seconds], dtype=torch.float64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())

    try:
        slowest(0.0)  # the first collective sets up the communicator: keep that out of the warm-up timing
        rows = []
        for size in sizes:
            x = torch.zeros(max(1, size // 4), dtype=torch.float32, device=device)
            nbytes = x.numel() * 4
            t0 = time.perf_counter()
            for _ in range(warmup):
                dist.all_reduce(x)
            sync()
            per_op = slowest((time.perf_counter() - t0) / max(1, warmup))
            count = max(3, min(iters, int(budget_s / max(per_op, 1e-9))))
            slowest(0.0)  # lines the ranks up before the clock starts
            t0 = time.perf_counter()
            for _ in range(count):
                dist.all_reduce(x)
            sync()
            seconds = slowest((time.perf_counter() - t0) / count)
            algbw, busbw = allreduce_bandwidth(nbytes, seconds, nranks)
            rows.append({"bytes": nbytes, "iters": count, "time_us": seconds * 1e6, "algbw_gbps": algbw,
                         "busbw_gbps": busbw})
            del x
        if rank == 0:  # with the variables the measurement ran under (NVLink multicast off, …)
            seen = {k: os.environ[k] for k in sorted(os.environ) if k.startswith(("NCCL_", "NVSHMEM_", "TORCH_"))}
            atomic_write(out, json.dumps({"backend": backend, "nranks": nranks, "rows": rows, "env": seen}))
    finally:
        dist.destroy_process_group()


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
        from ddp_runner.diagnostics.doctor import _bench_worker as worker  # by its module name, also under `python -m`

        with _env_added(args[-1]):  # in the workers' environment from their first instruction
            ctx = mp.start_processes(worker, args=args, nprocs=nproc, join=False, start_method="spawn")
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


# ---------------------------------------------------------------------------------------------------------------
# Reports
# ---------------------------------------------------------------------------------------------------------------


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


def render(report: dict[str, Any]) -> str:
    """The report as a plain aligned table, then the mapping, bandwidth and environment details."""
    checks = report["checks"]
    w = max(len(c["name"]) for c in checks)
    lines = ["ddp-doctor: preflight checks for multi-GPU training", "",
             f"{'CHECK':<{w}}  {'STATUS':<7}  EXPLANATION"]
    lines += [f"{c['name']:<{w}}  {c['status'].upper() if c['status'] == FAIL else c['status']:<7}  {c['summary']}"
              for c in checks]
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
    return "\n".join(lines)


def _parse_sizes(text: str) -> list[int]:
    try:
        return [parse_size(s) for s in text.split(",") if s.strip()]
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ddp-doctor", description="Preflight checks for multi-GPU PyTorch training: "
                                "devices, topology, visible-device mapping, NCCL/gloo, /dev/shm, environment, and "
                                "a short all-reduce bus-bandwidth measurement. Exit code 1 when a check fails.")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--no-bandwidth", action="store_true", help="skip the all-reduce measurement")
    p.add_argument("--sizes", type=_parse_sizes, default=None,
                   help="all-reduce sizes, e.g. 1M,64M,512M (default 1M…512M on GPU, 1M…64M on CPU)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="where to measure: auto = NCCL when 2+ GPUs, else gloo on CPU")
    p.add_argument("--nproc", type=int, default=None, help="processes (default: every GPU, or 2 on CPU)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds before the measurement counts as a hang")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """``ddp-doctor``: print the report (table or ``--json``); 1 when a check fails, else 0."""
    args = _parser().parse_args(argv)
    if args.nproc is not None and args.nproc < 2:
        print("ddp-doctor: --nproc must be at least 2 (an all-reduce across one process measures nothing)",
              file=sys.stderr)
        return 2
    progress = None if args.json else (lambda msg: print(f"checking {msg} …", file=sys.stderr, flush=True))
    report = full_report(bandwidth=not args.no_bandwidth, device=args.device, nproc=args.nproc, sizes=args.sizes,
                         timeout_s=args.timeout, progress=progress)
    print(json.dumps(report, indent=2) if args.json else render(report))
    return 1 if report["status"] == FAIL else 0


if __name__ == "__main__":
    raise SystemExit(main())
