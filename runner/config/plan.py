"""The plan: a pure function from a composed config and the visible devices to what will run.

Everything here is arithmetic and checks, no I/O, so every refusal can be tested directly and happens
before any process starts.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ddp_runner.contract.errors import (
    PlanError,
)
from ddp_runner.contract.rules import explain, flatten, global_batch


@dataclass(frozen=True)
class Gpu:
    """One visible CUDA device: its local index is its position in the visible list."""

    physical_index: int
    name: str
    uuid: str = ""


AUTO = "auto"  # batch.per_rank=auto: the micro-batch is fitted to the device (docs/config.md)

# How a task that makes or loads its own data tells the driver its size (else data.num_samples is planned with).
OWN_DATA_FIX = ("; a task that loads its own data tells the driver how much: train_samples(cfg) in its task.checks"
                " module (docs/own-task.md)")


@dataclass(frozen=True)
class Plan:
    """What will run. ``global_batch = per_rank_batch × world_size × accumulation`` always holds."""

    world_size: int
    per_rank_batch: int
    accumulation: int
    global_batch: int
    device: str
    backend: str
    nnodes: int
    nproc_per_node: int
    # local rank -> visible GPU (empty on CPU): local rank indexes the *visible* list.
    gpus: tuple[Gpu, ...] = field(default_factory=tuple)
    # The training set's size planned with (None: not known before launch); run.json records it.
    train_samples: int | None = None
    # batch.per_rank=auto: {"mode": "auto", "per_rank_share", "start", "why"} (None: the micro-batch was given).
    micro_batch: dict[str, Any] | None = None

    @property
    def explanation(self) -> str:
        """One line a reviewer can read: how the global batch comes about."""
        return explain(self.global_batch, self.per_rank_batch, self.world_size, self.accumulation)

    def to_manifest(self) -> dict[str, Any]:
        """The plan as recorded in run.json."""
        d = asdict(self)
        d["gpus"] = [asdict(g) for g in self.gpus]
        d["explanation"] = self.explanation
        return d


def _positive_int(cfg: Mapping[str, Any], key: str, fix: str) -> int:
    value = _get(cfg, key)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise PlanError(key, value, "must be a positive integer", fix)
    return value


def _get(cfg: Mapping[str, Any], dotted: str) -> Any:
    node: Any = cfg
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, Mapping) else None
    return node


def _check_inductor(wanted: Mapping[str, Any], known: Mapping[str, Any] | None) -> None:
    """Each ``train.inductor`` key must be a torch._inductor.config setting, with a value of its default's type."""
    if not wanted or known is None:
        return
    for key, value in wanted.items():
        if key not in known:
            raise PlanError(f"train.inductor.{key}", value, "not a torch._inductor.config setting",
                            "check the name in torch/_inductor/config.py (nested settings as triton.cudagraphs)")
        default = known[key]
        if isinstance(default, bool) and not isinstance(value, bool):
            raise PlanError(f"train.inductor.{key}", value, "this setting is a boolean",
                            f"use +train.inductor.{key}=true or false")


def nodes_key(cfg: Mapping[str, Any]) -> str:
    """The key the user gives the node count by: ``launcher.nodes`` where the launcher has one (kubernetes, whose
    ``nnodes`` follows it), else ``launcher.nnodes``."""
    return "launcher.nodes" if "nodes" in (_get(cfg, "launcher") or {}) else "launcher.nnodes"


def node_range(cfg: Mapping[str, Any]) -> tuple[int, int]:
    """``launcher.nnodes`` as (min, max) nodes: an int ``n`` is ``(n, n)``; ``"1:2"`` an elastic range (torchrun's
    own syntax). The plan's world size is the maximum's: ``world_size = max nodes × processes per node``."""
    value, key = _get(cfg, "launcher.nnodes"), nodes_key(cfg)
    fix = f"set {key} to the number of hosts (e.g. 2) or an elastic range min:max (e.g. 1:2)"
    if isinstance(value, str) and value.count(":") == 1:
        lo, hi = value.split(":")
        if lo.strip().isdigit() and hi.strip().isdigit() and 0 < int(lo) <= int(hi):
            if (_get(cfg, "launcher.name") or "local") != "multinode" and int(lo) != int(hi):
                raise PlanError(key, value, "elastic node ranges need launcher=multinode", fix)
            return int(lo), int(hi)
        raise PlanError(key, value, "not a range min:max of positive node counts", fix)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise PlanError(key, value, "must be a positive integer or a range min:max", fix)
    return value, value


def derive_accumulation(global_batch: int, per_rank: int, world_size: int) -> int:
    """Accumulation steps that make ``global_batch`` exactly; refuses indivisible values."""
    step = per_rank * world_size
    if global_batch % step:
        lower, upper = (global_batch // step) * step, (global_batch // step + 1) * step
        near = f"{lower} or {upper}" if lower else f"{upper}"
        raise PlanError(
            "batch.global",
            global_batch,
            f"not divisible by batch.per_rank × world_size = {per_rank} × {world_size} = {step}",
            f"use a multiple of {step} (e.g. {near}), or change batch.per_rank / world_size",
        )
    return global_batch // step


def make_plan(
    cfg: Mapping[str, Any],
    gpus: Sequence[Gpu],
    train_samples: int | None = None,
    inductor_settings: Mapping[str, Any] | None = None,
    data_file: str | None = None,
) -> Plan:
    """Turn a composed config and the visible GPUs into a :class:`Plan`, or raise :class:`PlanError`.

    ``train_samples`` is the training set's size when known; ``data_file`` the ``data.path`` it was read from
    (a training set too small for one micro-batch per rank is then blamed on that file);
    ``inductor_settings`` torch._inductor's settings and their defaults (checked only when ``train.inductor``
    sets any).
    """
    from ddp_runner.config import validate

    validate.check_engine(cfg)  # types, ranges and choices of every engine key; the rest here needs devices
    world_size, nnodes, nproc = _ranks(cfg, gpus)
    micro_batch = None
    if _get(cfg, "batch.per_rank") == AUTO:  # the largest candidate; the memory plan and the workers may lower it
        per_rank, accumulation = per_rank_share(cfg, world_size), 1
        micro_batch = auto_record(per_rank, per_rank, "the whole per-rank share: no memory estimate to start from")
    else:
        per_rank = _positive_int(cfg, "batch.per_rank", "set batch.per_rank to a positive micro-batch, e.g. 8")
        accumulation = _accumulation(cfg, per_rank, world_size)
    device, backend = _device_and_backend(cfg, gpus, world_size, nnodes, nproc)
    _check_training(cfg, world_size, backend, inductor_settings)
    _check_data_fits(cfg, train_samples, data_file, world_size, per_rank, accumulation)
    return Plan(
        world_size=world_size,
        per_rank_batch=per_rank,
        accumulation=accumulation,
        global_batch=global_batch(per_rank, world_size, accumulation),
        device=device,
        backend=backend,
        nnodes=nnodes,
        nproc_per_node=nproc,
        gpus=tuple(gpus[:nproc]) if device == "cuda" else (),
        train_samples=train_samples,
        micro_batch=micro_batch,
    )


def per_rank_share(cfg: Mapping[str, Any], world_size: int) -> int:
    """``batch.per_rank=auto``: the samples each rank takes per optimizer step (``batch.global / world_size``), which
    every candidate micro-batch divides. Refused when the global batch is not fixed or the ranks cannot share it
    equally: auto changes how a rank's share is split, never the share."""
    fixed = _get(cfg, "batch.global")
    if fixed is None:
        raise PlanError("batch.per_rank", AUTO, "auto fits the micro-batch under a fixed global batch, and"
                        " batch.global is not set", "set batch.global (e.g. batch.global=64), or give batch.per_rank"
                        " a number")
    _positive_int(cfg, "batch.global", "set batch.global to a positive global batch")
    if fixed % world_size:
        lower, upper = fixed // world_size * world_size, (fixed // world_size + 1) * world_size
        raise PlanError("batch.per_rank", AUTO, f"batch.global={fixed} is not divisible by world_size={world_size},"
                        " so the ranks cannot take equal shares of it",
                        f"use batch.global={lower or upper}" + (f" or {upper}" if lower else "")
                        + ", or another world_size")
    return fixed // world_size


def auto_record(share: int, start: int, why: str) -> dict[str, Any]:
    """run.json's ``plan.micro_batch`` for ``batch.per_rank=auto``: the per-rank share, the micro-batch the ranks
    start from, and why that one."""
    return {"mode": AUTO, "per_rank_share": share, "start": start, "why": why}


def _ranks(cfg: Mapping[str, Any], gpus: Sequence[Gpu]) -> tuple[int, int, int]:
    """World size (``auto``: one rank per visible GPU), nodes, and processes per node."""
    launcher = _get(cfg, "launcher.name") or "local"
    _, nnodes = node_range(cfg)
    if _get(cfg, "world_size") == "auto":
        if not gpus or _get(cfg, "device") == "cpu":
            raise PlanError("world_size", "auto", "auto means one rank per visible GPU, and none is visible",
                            "set world_size to a number of CPU ranks, e.g. world_size=2")
        per_node = _get(cfg, "launcher.nproc_per_node") or len(gpus)
        cfg = {**cfg, "world_size": per_node * nnodes}
    world_size = _positive_int(cfg, "world_size", "set world_size to the number of ranks, e.g. world_size=2")
    if nnodes != 1 and launcher == "local":
        raise PlanError("launcher.nnodes", nnodes, "the local launcher runs on this host only",
                        "use launcher.nnodes=1, or launcher=multinode (or launcher=slurm) for several hosts")
    if world_size % nnodes:
        raise PlanError(
            "world_size", world_size, f"not divisible by {nodes_key(cfg)}={nnodes}",
            "use the same number of processes on every node (world_size = nnodes × processes per node)",
        )
    per_node = _get(cfg, "launcher.nproc_per_node")
    if per_node is not None:
        per_node = _positive_int(cfg, "launcher.nproc_per_node", "set launcher.nproc_per_node to the processes"
                                 " each node starts, e.g. 1")
        if per_node * nnodes != world_size:
            raise PlanError("world_size", world_size,
                            f"is not launcher.nnodes × launcher.nproc_per_node = {nnodes} × {per_node}"
                            f" = {nnodes * per_node}",
                            f"use world_size={nnodes * per_node}, or change launcher.nnodes /"
                            " launcher.nproc_per_node")
    return world_size, nnodes, world_size // nnodes


def _accumulation(cfg: Mapping[str, Any], per_rank: int, world_size: int) -> int:
    """``batch.accumulation``, or derived from a fixed ``batch.global``."""
    fixed = _get(cfg, "batch.global")
    if fixed is None:
        return _positive_int(cfg, "batch.accumulation", "set batch.accumulation to 1 or more")
    _positive_int(cfg, "batch.global", "set batch.global to a positive global batch, or null")
    return derive_accumulation(fixed, per_rank, world_size)


def _device_and_backend(cfg: Mapping[str, Any], gpus: Sequence[Gpu], world_size: int, nnodes: int,
                        nproc: int) -> tuple[str, str]:
    """``device`` and ``backend`` with ``auto`` decided; never more processes than visible GPUs."""
    device = _get(cfg, "device")
    backend = _get(cfg, "backend")
    if device == "cuda" and not gpus:
        raise PlanError(
            "device", device, "no CUDA device is visible on this host (CUDA_VISIBLE_DEVICES respected)",
            "use device=cpu (or device=auto), or run on a host with GPUs",
        )
    if backend == "nccl" and not gpus:
        raise PlanError("backend", backend, "NCCL needs CUDA devices and none is visible",
                        "use backend=gloo (or backend=auto) on a CPU host")
    if device == "auto":
        device = "cuda" if gpus else "cpu"
    if backend == "nccl" and device == "cpu":
        raise PlanError("backend", backend, "NCCL cannot run on device=cpu", "use backend=gloo or device=cuda")
    if backend == "auto":
        backend = "nccl" if device == "cuda" else "gloo"
    if device == "cuda" and nproc > len(gpus):
        raise PlanError(
            "world_size", world_size,
            f"{nproc} processes per node but only {len(gpus)} GPU(s) visible (CUDA_VISIBLE_DEVICES respected);"
            " DDP needs one GPU per process",
            f"use world_size={len(gpus) * nnodes} or fewer, or device=cpu",
        )
    return device, backend


def _check_training(cfg: Mapping[str, Any], world_size: int, backend: str,
                    inductor_settings: Mapping[str, Any] | None) -> None:
    """The training keys whose rules need the plan: run length, DDP's communication, the compiler's settings."""
    if _get(cfg, "train.max_steps") is not None:
        _positive_int(cfg, "train.max_steps", "set train.max_steps to a positive number of optimizer steps, or null")
    else:
        _positive_int(cfg, "train.epochs", "set train.epochs to 1 or more (or set train.max_steps)")
    if _get(cfg, "train.ddp_comm") == "bf16" and backend != "nccl":
        raise PlanError("train.ddp_comm", "bf16", f"bf16 gradient all-reduce needs NCCL; this run uses {backend}",
                        "use train.ddp_comm=fp32 (or run on GPUs with backend=nccl)")
    bucket_mb = _get(cfg, "train.ddp_bucket_mb")
    if (bucket_mb is not None and bucket_mb < 1 and world_size > 1 and _get(cfg, "train.compile")
            and _get(cfg, "train.ddp_split_graph") is not False):
        # torch._dynamo's DDP graph splitter asserts that DDP's first bucket (1 MB) is no larger than the others.
        raise PlanError("train.ddp_bucket_mb", bucket_mb,
                        "below DDP's 1 MB first bucket, which the compiler's DDP graph split refuses",
                        "use train.ddp_bucket_mb=1 or more (or train.ddp_split_graph=false)")
    inductor = flatten(_get(cfg, "train.inductor") or {})
    if inductor and not _get(cfg, "train.compile"):
        key = next(iter(inductor))
        raise PlanError(f"train.inductor.{key}", inductor[key], "has no effect: train.compile is false",
                        "set train.compile=true, or leave train.inductor out")
    _check_inductor(inductor, inductor_settings)


def _check_data_fits(cfg: Mapping[str, Any], train_samples: int | None, data_file: str | None, world_size: int,
                     per_rank: int, accumulation: int) -> None:
    """Every rank gets a full micro-batch, and an epoch holds one optimizer step."""
    if train_samples is None:
        return
    if train_samples < world_size * per_rank and data_file is not None:
        raise PlanError(
            "data.path", data_file,
            f"gives {train_samples} training samples, fewer than world_size × batch.per_rank ="
            f" {world_size} × {per_rank} = {world_size * per_rank}, so some rank would get no full micro-batch",
            "use a larger file, or lower batch.per_rank, world_size or the task's sample length",
        )
    # data=synthetic: the count is data.num_samples, unless the task's train_samples(cfg) gave its own.
    own = _get(cfg, "data.name") == "synthetic"
    if train_samples < world_size * per_rank:
        raise PlanError(
            "batch.per_rank", per_rank,
            f"the training set has {train_samples} samples{' (data.num_samples)' if own else ''}, fewer than"
            f" world_size × batch.per_rank = {world_size} × {per_rank} = {world_size * per_rank}, so some rank"
            " would get no full micro-batch",
            "lower batch.per_rank or world_size, or give the task more data"
            + (OWN_DATA_FIX if own else ""),
        )
    # The sampler pads to ceil(samples / world_size) per rank; an epoch must hold one optimizer step.
    micro = -(-train_samples // world_size) // per_rank
    if micro < accumulation:
        fixed = _get(cfg, "batch.global")
        key, value = ("batch.global", fixed) if fixed is not None else ("batch.accumulation", accumulation)
        raise PlanError(key, value,
                        f"an epoch gives each rank {micro} micro-batches of {per_rank} ({train_samples} samples over"
                        f" {world_size} ranks), fewer than the {accumulation} one optimizer step accumulates",
                        "lower it (or batch.per_rank), or give the task more data"
                        + (OWN_DATA_FIX if _get(cfg, "data.name") == "synthetic" else ""))


def cpu_oversubscribed(plan: Plan, cores: int) -> str | None:
    """A warning when CPU ranks outnumber the host's ``cores`` (the ones this process may run on): every rank is a
    full process that needs a core; more ranks than cores share them and each step waits for the slowest."""
    if plan.device != "cpu" or plan.nproc_per_node <= cores:
        return None
    per_host = "world_size" if plan.nnodes == 1 else "launcher.nproc_per_node"
    return (f"{per_host}: {plan.nproc_per_node} CPU ranks on this host, which has {cores} CPU"
            f" core{'s' if cores != 1 else ''} for them: the ranks share cores and every step waits for the slowest."
            f" Fix: world_size={cores} or fewer on this host (or run more nodes); this runs, slowly")


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity), or the host's count where affinity is unknown."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1
