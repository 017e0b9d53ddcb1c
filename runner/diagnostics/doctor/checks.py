"""ddp-doctor's checks of the host: the statuses and the check record, /dev/shm, the environment, the host and
torch's own view. torch is imported only inside :func:`torch_checks`."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ddp_runner.contract.layout import SAFE_ENV

OK, WARN, FAIL, SKIPPED = "ok", "warn", "fail", "skipped"
_SEVERITY = {SKIPPED: 0, OK: 0, WARN: 1, FAIL: 2}

MiB = 1 << 20
GiB = 1 << 30
SHM_MIN_BYTES = 1 * GiB  # DataLoader workers pass batches through /dev/shm and NCCL keeps its buffers there
ENV_PREFIXES = ("NCCL_", "TORCH_", "CUDA_", "NVSHMEM_")
# Variables that switch an NCCL transport off: the seed warns against disabling transports to silence a timeout.
TRANSPORT_OFF = ("NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE", "NCCL_IB_DISABLE", "NCCL_NVLS_ENABLE")


@dataclass
class Check:
    """One check's outcome: ``summary`` is the one line a human reads, ``data`` what a program reads."""

    name: str
    status: str
    summary: str
    data: dict[str, Any] = field(default_factory=dict)


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
    checks = [_torch_check(torch, cuda, visible_count), _nccl_check(torch, dist, cuda)]
    gloo = dist.is_available() and dist.is_gloo_available()
    checks.append(Check("gloo", OK if gloo else FAIL, "available (CPU runs)" if gloo else
                        "not in this torch build: CPU runs cannot form a process group", {"available": gloo}))
    return checks


def _torch_check(torch: Any, cuda: bool, visible_count: int | None) -> Check:
    """torch's build and CUDA device count, beside the GPUs nvidia-smi shows."""
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
    return Check("torch", status, text, data)


def _nccl_check(torch: Any, dist: Any, cuda: bool) -> Check:
    """NCCL in this torch and its version; needed only where CUDA devices are."""
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
        return Check("nccl", OK, f"NCCL {nccl_version or '(version unknown)'}", ndata)
    if nccl_ok:
        return Check("nccl", SKIPPED, "not used: no CUDA device on this host (CPU runs use gloo)", ndata)
    if cuda:
        return Check("nccl", FAIL, "CUDA devices but this torch has no NCCL: multi-GPU DDP will not run", ndata)
    return Check("nccl", SKIPPED, "not in this torch build (CPU runs use gloo)", ndata)

