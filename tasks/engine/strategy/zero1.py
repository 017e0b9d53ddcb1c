"""ZeRO stage 1: DDP for the model and gradients, the optimizer state and step sharded across ranks.

Each rank keeps the AdamW moments of its share of the parameters only and updates only those parameters;
``torch.distributed.optim.ZeroRedundancyOptimizer`` then broadcasts the updated parameters. The forward,
backward and gradient all-reduce are DDP's (``ddp.py``), so the loss curve is DDP's.

Checkpoints consolidate the optimizer state onto rank 0 (a collective), which saves the same single-file
checkpoint as DDP: it resumes at any world size and under either strategy.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch.distributed.optim import ZeroRedundancyOptimizer

from ddp_runner.tasks.engine.strategy.ddp import DDPStrategy


class Zero1Strategy(DDPStrategy):
    """:class:`DDPStrategy` whose optimizer is a :class:`ZeroRedundancyOptimizer` (see :func:`wrap_optimizer`)."""

    full_state_on_rank0 = False  # the optimizer state is spread over the ranks: saving is collective

    def wrap_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """The same optimizer class, groups and settings, with its state partitioned over the ranks."""
        if self.world_size == 1:
            return optimizer  # nothing to partition
        # Only what the class's constructor takes (AdamW's defaults also list Adam's ``decoupled_weight_decay``).
        accepted = inspect.signature(type(optimizer).__init__).parameters
        defaults = {k: v for k, v in optimizer.defaults.items() if k in accepted}
        groups = [{k: v for k, v in g.items()} for g in optimizer.param_groups]
        first, rest = groups[0], groups[1:]
        zero = ZeroRedundancyOptimizer(first.pop("params"), optimizer_class=type(optimizer),
                                       **{**defaults, **{k: v for k, v in first.items() if k in defaults}})
        for g in rest:
            if g["params"]:
                zero.add_param_group(g)
        return zero

    def state_dict(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """The whole model and the optimizer state consolidated onto rank 0 (every rank must call it; only rank
        0's result is the checkpoint)."""
        if isinstance(optimizer, ZeroRedundancyOptimizer):
            optimizer.consolidate_state_dict(to=0)
            if torch.distributed.get_rank() != 0:
                return {"model": {}, "optimizer": {}}
        return {"model": self.model.state_dict(), "optimizer": optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any], optimizer: torch.optim.Optimizer) -> None:
        """Every rank loads the whole checkpoint; each keeps the optimizer state of its own partition."""
        self.model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
