"""Optimizer, learning-rate schedule and compiler settings, built from ``train.*``."""

from __future__ import annotations

import math
from typing import Any

import torch

from ddp_runner.contract.errors import SCHEDULES
from ddp_runner.contract.rules import flatten
from ddp_runner.tasks.engine.config import Config


def build_optimizer(t: Config, params: list[torch.Tensor]) -> torch.optim.Optimizer:
    """SGD or AdamW over ``params`` from ``train.*`` (the driver checked the names)."""
    if t.optimizer == "sgd":
        return torch.optim.SGD(params, lr=t.lr, momentum=t.momentum, weight_decay=t.weight_decay)
    if t.optimizer == "adamw":
        # Decay matrices only (nanoGPT's rule): norms and biases are not regularised.
        decay = [p for p in params if p.dim() >= 2]
        no_decay = [p for p in params if p.dim() < 2]
        groups = [{"params": decay, "weight_decay": t.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
        # Fused on every device (PyTorch has CPU and CUDA kernels): one kernel per step, and the clip factor folds
        # into it (strategy/grad_sync.clipped_step), so CPU runs take the same path as GPU runs.
        return torch.optim.AdamW(groups, lr=t.lr, betas=tuple(t.betas), fused=True)
    raise ValueError(f"train.optimizer={t.optimizer!r}: unknown optimizer. Fix: use sgd or adamw")


def lr_factor(step: int, total: int, schedule: str, warmup: int, min_ratio: float) -> float:
    """Multiplier of the base LR at optimizer step ``step`` (0-based): linear warmup, then constant or cosine.

    Cosine falls from 1 after the warmup to ``min_ratio`` at step ``total`` and stays there.
    """
    # Checked before the warmup branch: LambdaLR calls this at construction (step 0), so a bad schedule fails
    # at start-up instead of after the warmup.
    if schedule not in SCHEDULES:
        raise ValueError(f"train.schedule={schedule!r}: unknown schedule. Fix: use constant or cosine")
    if warmup and step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    span = max(1, total - warmup)
    progress = min(1.0, (step - warmup) / span)
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def apply_inductor_settings(settings: dict[str, Any]) -> None:
    """Set ``train.inductor`` (nested or dotted names) on torch._inductor.config; the driver checked the names."""
    import torch._inductor.config as inductor_config

    for key, value in flatten(settings).items():
        setattr(inductor_config, key, value)
