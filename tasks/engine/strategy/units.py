"""Which modules FSDP shards on their own (light: the driver's probe counts them without importing FSDP)."""

from __future__ import annotations

import torch


def shard_units(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules sharded on their own: every element of every ``nn.ModuleList`` (a GPT's blocks)."""
    return [m for lst in model.modules() if isinstance(lst, torch.nn.ModuleList) for m in lst]
