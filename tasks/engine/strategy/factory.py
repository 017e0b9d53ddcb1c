"""``strategy.name`` → the strategy object that wraps the model (``ddp``, ``zero1``, ``fsdp``)."""

from __future__ import annotations

from typing import Any

import torch

from ddp_runner.tasks.engine.strategy.base import Strategy

NAMES = ("ddp", "zero1", "fsdp")


def build(cfg: Any, model: torch.nn.Module, device: torch.device, local_rank: int, world_size: int) -> Strategy:
    """The configured strategy around ``model`` (a config without a ``strategy`` group means DDP)."""
    scfg = cfg.get("strategy") or {}
    name = scfg.get("name", "ddp")
    if name == "ddp":
        from ddp_runner.tasks.engine.strategy.ddp import DDPStrategy

        return DDPStrategy(model, device, local_rank, world_size, cfg.train)
    if name == "zero1":
        from ddp_runner.tasks.engine.strategy.zero1 import Zero1Strategy

        return Zero1Strategy(model, device, local_rank, world_size, cfg.train)
    if name == "fsdp":
        from ddp_runner.tasks.engine.strategy.fsdp import FSDPStrategy

        return FSDPStrategy(model, device, local_rank, world_size, cfg.train, scfg)
    raise ValueError(f"strategy={name!r}: unknown strategy. Fix: use one of {', '.join(NAMES)}")
