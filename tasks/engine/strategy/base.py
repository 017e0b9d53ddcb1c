"""The parallel-strategy seam: everything the engine's loop asks of a way of spreading the model over ranks.

The loop never touches DDP (or a sharded wrapper) directly. Per micro-step it asks the strategy for the sync
context and the forward to call, and hands it the scaled loss to run backward; for checkpoints it asks for the
state to save and gives back the state to load. A sharded strategy (FSDP2, a sharded optimizer) implements the
same methods without touching the loop.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, Protocol

import torch


class Strategy(Protocol):
    """How the model is wrapped, synchronised and checkpointed across ranks."""

    model: torch.nn.Module          # the task's own module, unwrapped: parameters, evaluation, shapes
    params: list[torch.Tensor]      # the trained parameters, in the optimizer's order
    cudagraphs: bool                # micro-steps replay CUDA graphs: mark each one's start
    full_state_on_rank0: bool       # the checkpoint's state is complete on global rank 0 alone; False: every rank
                                    # calls state_dict (a collective). Optional extras, read with getattr:
                                    # ``sharded_checkpoint`` (every rank writes its shards: checkpoint/sharded.py)
                                    # and ``wrap_optimizer(opt)`` (zero1: the optimizer state partitioned)

    def sync(self, last: bool) -> contextlib.AbstractContextManager:
        """Context around forward *and* backward of a micro-step; only the ``last`` one synchronises."""
        ...

    def forward(self, last: bool) -> Callable[..., torch.Tensor]:
        """The (possibly compiled) callable that returns the micro-batch's mean loss."""
        ...

    def backward(self, scaled_loss: torch.Tensor, *, first: bool, last: bool) -> None:
        """Backward of one micro-step: gradients land in ``p.grad``, synchronised after the ``last``."""
        ...

    def after_optimizer_step(self, optimizer: torch.optim.Optimizer, accumulation: int) -> None:
        """Ready the gradient buffers for the next optimizer step."""
        ...

    def state_dict(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """``{"model": ..., "optimizer": ...}`` to checkpoint."""
        ...

    def load_state_dict(self, state: dict[str, Any], optimizer: torch.optim.Optimizer) -> None:
        """Restore what :meth:`state_dict` returned."""
        ...
