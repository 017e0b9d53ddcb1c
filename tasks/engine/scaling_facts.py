"""summary.json's ``scaling_facts`` (names: runner/contract/scaling.py): the gradient and parameter bytes a step's
collectives move, and this rank's threads, cores and neighbours on the host. ddp-compare's scaling projection
prices the collectives with them; the time breakdown gives the time they took."""

from __future__ import annotations

import os
from typing import Any

import torch

from ddp_runner.contract import scaling

WIRE_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def _element_bytes(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def entry(params: list[torch.Tensor], cfg: Any) -> dict[str, Any]:
    """``{"scaling_facts": …}`` for the summary, from the strategy's parameters and the run's config."""
    return {scaling.SUMMARY_KEY: of(params, (cfg.get("strategy") or {}).get("name", "ddp"), cfg.train)}


def of(params: list[torch.Tensor], strategy: str, train_cfg: Any) -> dict[str, Any]:
    """The facts for ``params`` (the strategy's trainable parameters; a sharded one's report their whole shape)
    under ``strategy`` (``ddp``, ``zero1``, ``fsdp``) and ``train_cfg`` (train.*)."""
    numel = sum(p.numel() for p in params)
    own = sum(p.numel() * p.element_size() for p in params)
    if strategy == "fsdp":  # gradients reduced in fp32 under mixed precision, parameters gathered in train.precision
        low = WIRE_DTYPES.get(train_cfg.get("precision"))
        grad, gathered = (numel * 4, numel * _element_bytes(low)) if low is not None else (own, own)
    else:
        comm = WIRE_DTYPES.get(train_cfg.get("ddp_comm") or "fp32")
        grad, gathered = (numel * _element_bytes(comm) if comm is not None else own), own
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        cores = os.cpu_count() or 1
    return {scaling.TRAINABLE: numel, scaling.GRAD_BYTES: grad, scaling.PARAM_BYTES: gathered,
            scaling.THREADS: torch.get_num_threads(), scaling.CORES: cores,
            scaling.LOCAL_WORLD: int(os.environ.get("LOCAL_WORLD_SIZE", "1"))}
