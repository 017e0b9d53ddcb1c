"""What the driver's memory planner needs to know about a task's model, measured without building it for real.

Run by the driver in a subprocess (``python -m tasks.engine.memory_probe`` with the resolved config as JSON on
stdin), so the driver itself never imports torch: the model is built on the meta device (no memory, no init
cost) and its parameters are counted, as a whole and per FSDP shard unit. A GPT-like model (``layers``,
``width``, ``heads``, ``context``, ``vocab``) also reports its shape for the activation formula. Prints one JSON
object.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import torch

from tasks import registry
from tasks.engine.config import Config
from tasks.engine.strategy.fsdp import shard_units

ARCH = ("layers", "width", "heads", "context", "vocab", "loss")


def probe(cfg: Config) -> dict[str, Any]:
    """Parameter counts (unique, largest shard unit, outside the units) and the model's shape when it has one.
    CUDA is never initialised here (the driver asks nvidia-smi for the GPU's memory)."""
    # The task builds its model on the device it is given (its datasets stay real: their checks read values).
    model = registry.build(cfg, torch.device("meta")).model
    params = {id(p): p.numel() for p in model.parameters() if p.requires_grad}  # tied weights once
    units = [{id(p): p.numel() for p in u.parameters()} for u in shard_units(model)]
    in_units = {k for u in units for k in u}
    out: dict[str, Any] = {
        "params": sum(params.values()),
        "largest_unit": max((sum(u.values()) for u in units), default=0),
        "root": sum(n for k, n in params.items() if k not in in_units),
        "arch": {k: getattr(model, k) for k in ARCH if hasattr(model, k)} or None,
    }
    return out


if __name__ == "__main__":
    print(json.dumps(probe(Config(json.load(sys.stdin)))))
