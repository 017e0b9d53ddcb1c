"""What the driver must learn from torch before launch, in one subprocess (the driver itself never imports torch).

``python -m ddp_runner.tasks.engine.driver_probe`` reads ``{"config": <resolved config>, "want": [...]}`` as JSON on
stdin and prints one JSON object with the parts asked for:

- ``model``: the task's model built on the meta device (no memory, no init cost), its trained parameters counted
  as a whole and per FSDP shard unit; a GPT-like model (``layers``, ``width``, ``heads``, ``context``, ``vocab``)
  also reports its shape for the memory planner's activation formula;
- ``inductor``: for each ``train.inductor`` key, the default of that torch._inductor.config setting (absent: no
  such setting), so the driver can refuse a misspelt or mistyped one.
"""

from __future__ import annotations

import json
import sys
from typing import Any

ARCH = ("layers", "width", "heads", "context", "vocab", "loss", "dropout")


def model_facts(cfg: Any) -> dict[str, Any]:
    """Parameter counts (unique, largest shard unit, outside the units) and the model's shape when it has one.
    CUDA is never initialised here (the driver asks nvidia-smi for the GPU's memory)."""
    import torch

    from ddp_runner.tasks import registry
    from ddp_runner.tasks.engine.strategy.units import shard_units

    # The task builds its model on the device it is given (its datasets stay real: their checks read values).
    model = registry.build(cfg, torch.device("meta")).model
    params = {id(p): p.numel() for p in model.parameters() if p.requires_grad}  # tied weights once
    units = [{id(p): p.numel() for p in u.parameters()} for u in shard_units(model)]
    in_units = {k for u in units for k in u}
    return {
        "params": sum(params.values()),
        "largest_unit": max((sum(u.values()) for u in units), default=0),
        "root": sum(n for k, n in params.items() if k not in in_units),
        "arch": {k: getattr(model, k) for k in ARCH if hasattr(model, k)} or None,
    }


def inductor_defaults(keys: list[str]) -> dict[str, Any]:
    """The default of each of ``keys`` (dotted: ``triton.cudagraphs``) that torch._inductor.config has, as JSON
    (a value JSON cannot hold becomes its repr)."""
    import torch._inductor.config as inductor_config

    known = inductor_config.get_config_copy()
    out: dict[str, Any] = {}
    for key in keys:
        if key in known:
            value = known[key]
            out[key] = value if isinstance(value, (bool, int, float, str, type(None))) else repr(value)
    return out


def main() -> None:
    """Answer the driver's request on stdin with one JSON line on stdout."""
    from ddp_runner.tasks.engine.config import Config

    request = json.load(sys.stdin)
    out: dict[str, Any] = {}
    if "inductor" in request["want"]:
        out["inductor"] = inductor_defaults(request.get("inductor_keys") or [])
    if "model" in request["want"]:
        out["model"] = model_facts(Config(request["config"]))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
