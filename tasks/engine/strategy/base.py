"""The parallel-strategy seam: everything the engine's loop asks of a way of spreading the model over ranks.

The loop never touches DDP (or a sharded wrapper) directly. Per micro-step it asks the strategy for the sync
context and the forward to call, and hands it the scaled loss to run backward; for checkpoints it asks for the
state to save and gives back the state to load. A sharded strategy (FSDP2, a sharded optimizer) implements the
same methods without touching the loop.

Every strategy inherits :class:`Strategy`: the methods every strategy must write raise ``NotImplementedError``
here, and every extra a strategy may have is declared with its default, so the engine asks each strategy the same
questions and never probes for an attribute.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch


class Strategy:
    """How the model is wrapped, synchronised and checkpointed across ranks."""

    model: torch.nn.Module          # the task's own module, unwrapped: parameters, evaluation, shapes
    params: list[torch.Tensor]      # the trained parameters, in the optimizer's order

    # -- extras, with their defaults ------------------------------------------------------------------------
    cudagraphs: bool = False        # micro-steps replay CUDA graphs: mark each one's start
    full_state_on_rank0: bool = True  # the checkpoint's state is complete on global rank 0 alone; False: every
                                      # rank calls state_dict (a collective)
    sharded_checkpoint: bool = False  # every rank writes its own shards (checkpoint/sharded.py)
    collective_forward: bool = False  # every forward is a collective (parameters gathered): evaluation runs the
                                      # same number of forwards on every rank

    def wrap_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """The optimizer the engine steps; by default ``optimizer`` itself (zero1: its state partitioned)."""
        return optimizer

    def on_grads_ready(self, callback: Callable[[], None]) -> None:
        """Have ``callback`` called when the synchronising backward's last gradient exists (the start of the
        exposed gradient sync, for the engine's timing); by default never called (the strategy cannot tell)."""

    def settle_buckets(self, sync_step: Callable[[], None]) -> bool:
        """Before a resumed launch's first step: have its gradient reductions use the layout an uninterrupted run
        uses at that step, running ``sync_step`` (one throw-away synchronising forward and backward) if that takes
        one. Returns whether it ran; by default never (the layout does not depend on the launch's history)."""
        return False

    # -- what every strategy writes -------------------------------------------------------------------------

    def sync(self, last: bool) -> contextlib.AbstractContextManager:
        """Context around forward *and* backward of a micro-step; only the ``last`` one synchronises."""
        raise NotImplementedError

    def forward(self, last: bool) -> Callable[..., torch.Tensor]:
        """The (possibly compiled) callable that returns the micro-batch's mean loss."""
        raise NotImplementedError

    def backward(self, scaled_loss: torch.Tensor, *, first: bool, last: bool) -> None:
        """Backward of one micro-step: gradients land in ``p.grad``, synchronised after the ``last``."""
        raise NotImplementedError

    def after_optimizer_step(self, optimizer: torch.optim.Optimizer, accumulation: int) -> None:
        """Ready the gradient buffers for the next optimizer step."""
        raise NotImplementedError

    def state_dict(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """``{"model": ..., "optimizer": ...}`` to checkpoint."""
        raise NotImplementedError

    def load_state_dict(self, state: dict[str, Any], optimizer: torch.optim.Optimizer) -> None:
        """Restore what :meth:`state_dict` returned."""
        raise NotImplementedError
