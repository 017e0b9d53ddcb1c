"""The contract between a task and the one training engine.

A task is an importable module named by ``task.module`` in its YAML (or on the shell). It exposes
``build(cfg, device) -> TaskParts``: a model, datasets and a FLOP count; it never owns a loop. A task may also
name, with ``task.checks``, a light module (no torch import) whose ``check(cfg)`` the driver calls before
launch; it raises :class:`ConfigError` naming the key, the value and the fix.

This module imports nothing heavy, so the driver and light check modules may import it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from runner.contract.errors import PlanError as ConfigError
from tasks.engine.config import Config

if TYPE_CHECKING:
    import torch
    from torch.utils.data import Dataset

__all__ = ["Config", "ConfigError", "TaskParts"]


@dataclass
class TaskParts:
    """What a task hands to the engine.

    ``model.forward(x, y)`` returns the *mean* loss over the micro-batch (a scalar tensor), so the
    engine can compute exact sums as ``mean * len(batch)``. Dataset items are ``(x, y)`` tensor pairs (tensors
    or anything the default collate function stacks).
    """

    model: torch.nn.Module
    train_set: Dataset
    val_set: Dataset | None = None
    # Training FLOPs per sample (forward + backward), for MFU; None when unknown (MFU is then omitted).
    flops_per_sample: float | None = None
    # Tokens per sample, for tokens/s; None for tasks without tokens.
    tokens_per_sample: int | None = None
