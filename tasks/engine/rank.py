"""This rank's set-up and facts: who and where it is (:class:`Context`), its device and process group
(:func:`setup`), and what it reports about itself (:func:`facts`, written by the worker at start and end)."""

from __future__ import annotations

import contextlib
import os
import socket
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import IO, Any

import torch
import torch.distributed as dist

from ddp_runner.contract import layout, rules
from ddp_runner.tasks.engine.config import Config

AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class Context:
    """Who and where this rank is."""

    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    run_dir: str
    local_dir: str
    console: IO[str] | None
    device_name: str = "cpu"

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def setup(run_dir: str, local_dir: str, console: IO[str] | None, cfg: Config) -> Context:
    """Pick this rank's device (local rank indexes the visible devices) and join the process group."""
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    if cfg.train.get("deterministic"):
        deterministic_kernels()
    if cfg.device == "cuda":
        index = local_rank
        own = own_gpu(os.environ.get("CUDA_VISIBLE_DEVICES"), local_rank)
        if own is not None and cfg.train.get("own_gpu", True) and not torch.cuda.is_initialized():
            os.environ["CUDA_VISIBLE_DEVICES"], index = own, 0
        torch.cuda.set_device(index)
        cap, _ = rules.asked_cap_gb(cfg)
        fraction = memory_fraction(cap, torch.cuda.get_device_properties(index).total_memory)
        if fraction is not None:  # hold the run to the memory its plan was checked against
            torch.cuda.set_per_process_memory_fraction(fraction, index)
        torch.backends.cuda.matmul.allow_tf32 = True  # fp32 matmuls outside autocast use tensor cores
        torch.backends.cudnn.allow_tf32 = True
        device = torch.device("cuda", index)
        name = torch.cuda.get_device_name(device)
    else:
        device, name = torch.device("cpu"), "cpu"
    dist.init_process_group(
        cfg.backend, timeout=timedelta(seconds=cfg.timeout_s),
        device_id=device if device.type == "cuda" else None,
    )
    return Context(rank, local_rank, world_size, device, run_dir, local_dir, console, name)


def deterministic_kernels() -> None:
    """train.deterministic: every kernel deterministic (an op without a deterministic kernel raises, naming
    itself), so that the same plan gives the same bits on CUDA as on the CPU. Before CUDA is used: cuBLAS reads its
    workspace setting when it creates its handle."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    import torch._inductor.config as inductor_config

    if hasattr(inductor_config, "deterministic"):  # no on-device benchmarking that picks kernels of other numerics
        inductor_config.deterministic = True


def memory_fraction(cap_gb: float | None, total_bytes: int) -> float | None:
    """The fraction of a device of ``total_bytes`` that a cap of ``cap_gb`` GiB allows this process (for
    ``torch.cuda.set_per_process_memory_fraction``), so that a run allowed under a cap cannot use more than it:
    over it the allocator raises its out-of-memory error. None: no cap, or one at least the device's size."""
    if cap_gb is None or total_bytes <= 0 or cap_gb * 2**30 >= total_bytes:
        return None
    return cap_gb * 2**30 / total_bytes


def own_gpu(visible: str | None, local_rank: int) -> str | None:
    """The ``CUDA_VISIBLE_DEVICES`` under which local rank ``local_rank`` sees only its own GPU, as ``cuda:0`` (None:
    leave it as it is). Every rank then compiles for ``cuda:0``, and a rank other than 0 finds in the shared compile
    cache what a 1-GPU job or rank 0 compiled: inductor's cache keys hold the device index. The same mapping as
    torchrun's ``--virtual-local-rank``; the k-th visible device stays local rank k's."""
    if visible is None:
        return str(local_rank)
    entries = [e.strip() for e in visible.split(",")]
    if not visible.strip() or local_rank >= len(entries) or not entries[local_rank]:
        return None  # no GPU to narrow to: CUDA reports it as it would have
    return entries[local_rank]


def node() -> str:
    """This rank's node: the name its driver gave it (multi-node runs), its Slurm node index, else torchrun's group
    rank."""
    return os.environ.get(layout.ENV_NODE) or os.environ.get("SLURM_NODEID") or os.environ.get("GROUP_RANK", "0")


def device_label(ctx: Context) -> str:
    """``cuda:0``, or ``node1/cuda:0`` in a run of several nodes: how logs and records name this rank's device."""
    label = f"{ctx.device.type}:{ctx.local_rank}"
    if os.environ.get("LOCAL_WORLD_SIZE", "1") != os.environ.get("WORLD_SIZE", "1"):  # several nodes
        return f"node{node()}/{label}"
    return label


def facts(ctx: Context, **extra: Any) -> dict[str, Any]:
    """This rank's record for the driver (``layout.rank_facts``): host, device, versions, the world it ran in;
    ``extra``: how it ended."""
    facts: dict[str, Any] = {
        "rank": ctx.rank, "local_rank": ctx.local_rank, "host": socket.gethostname(), "pid": os.getpid(),
        "node": node(),
        "device": device_label(ctx), "device_name": ctx.device_name,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        # Where this job's ranks met and ran (a concurrent sweep's jobs each have their own; sweep.json shows them).
        "master_port": os.environ.get("MASTER_PORT"),
        "cpu_affinity": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "torch": torch.__version__, "backend": dist.get_backend() if dist.is_initialized() else None,
        "restart_count": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
        # The world this rank ran in, and when it said so: the driver tells this launch's files from an earlier
        # attempt's (an elastic job restarted on fewer nodes leaves the higher ranks' files behind).
        "world_size": ctx.world_size, "written": time.time(),
    }
    if ctx.device.type == "cuda":
        facts["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        facts["cuda"] = torch.version.cuda
        get_fraction = getattr(torch.cuda, "get_per_process_memory_fraction", None)
        if get_fraction is not None:
            facts["memory_fraction"] = get_fraction(ctx.device)
    facts.update(extra)
    return facts



def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """Autocast to ``train.precision`` (bf16, fp16) on this device; no autocast for fp32."""
    dtype = AUTOCAST_DTYPES.get(precision)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)

