"""The contract between a task and the one training engine.

A task module (``tasks/<name>.py``) exposes ``build(cfg, device) -> TaskParts``. It supplies a model,
datasets and a FLOP count; it never owns a loop.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils.data import Dataset


@dataclass
class TaskParts:
    """What a task hands to the engine.

    ``model.forward(x, y)`` returns the *mean* loss over the micro-batch (a scalar tensor), so the
    engine can compute exact sums as ``mean * len(batch)``. Dataset items are ``(x, y)`` tensor pairs.
    """

    model: torch.nn.Module
    train_set: Dataset
    val_set: Dataset | None = None
    # Training FLOPs per sample (forward + backward), for MFU; None when unknown (MFU is then omitted).
    flops_per_sample: float | None = None
    # Tokens per sample, for tokens/s; None for tasks without tokens.
    tokens_per_sample: int | None = None
