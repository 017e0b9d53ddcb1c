"""DDP, the first strategy: a full replica per rank, gradients averaged by all-reduce on the last micro-step.

At world size 1 the model runs without a DDP wrapper (nothing to synchronise, and the compiler sees one graph).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_runner.tasks.engine.strategy import ddp_compile, grad_sync
from ddp_runner.tasks.engine.strategy.base import Strategy

CUDAGRAPH_MODES = ("reduce-overhead", "max-autotune")  # torch.compile modes that capture CUDA graphs


class _SingleProcess(torch.nn.Module):
    """Stands in for DDP at world size 1: same call and ``no_sync`` surface, no communication."""

    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    def no_sync(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()


class DDPStrategy(Strategy):
    """DistributedDataParallel with ``no_sync`` on all but the last micro-step (see :class:`Strategy`)."""

    full_state_on_rank0 = True

    def __init__(self, model: torch.nn.Module, device: torch.device, local_rank: int, world_size: int,
                 train_cfg: Any) -> None:
        t = train_cfg
        self.model, self.world_size = model, world_size
        # Called when the synchronising backward's last gradient exists (the engine's timing sets it).
        self._grads_ready_callback: Callable[[], None] | None = None
        if world_size > 1:
            self.wrapped: DDP | _SingleProcess = DDP(
                model, device_ids=[device.index] if device.type == "cuda" else None,
                gradient_as_bucket_view=True, bucket_cap_mb=t.get("ddp_bucket_mb", 25),
            )
            if t.get("ddp_comm", "fp32") == "bf16":
                # Opt-in: gradients travel as bf16 (half the bytes), are averaged, and land back in fp32.
                from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

                hook = default_hooks.bf16_compress_hook
            else:  # averaging inside the all-reduce instead of one division kernel per parameter
                hook = grad_sync.mean_allreduce_hook
            self.wrapped.register_comm_hook(None, grad_sync.notify_last_bucket(hook, self._grads_ready))
        else:
            self.wrapped = _SingleProcess(model)
        compile_kwargs = {"mode": t.compile_mode} if t.get("compile_mode") else {}
        # The synchronising micro-step's callable, and the others' (ddp_compile.py says why they differ).
        self._sync_fwd, self._local_fwd = ddp_compile.compiled_forwards(
            self.wrapped, model, distributed=world_size > 1, compile=bool(t.compile),
            split=bool(t.get("ddp_split_graph", True)), scope=t.get("compile_scope") or "model", **compile_kwargs)
        # These modes replay each micro-step as CUDA graphs: no per-kernel launch cost.
        self.cudagraphs = bool(t.compile) and device.type == "cuda" and t.get("compile_mode") in CUDAGRAPH_MODES
        # Gradients live in their own buffers for the whole run: the first micro-step of an optimizer step copies
        # into them and later ones add (see backward), so they need no zeroing pass. Under CUDA graphs they must
        # not *be* graph outputs, which the next replay overwrites (pytorch/pytorch#169545).
        self.params = [p for p in model.parameters() if p.requires_grad]
        for p in self.params:
            p.grad = torch.zeros_like(p)

    def on_grads_ready(self, callback: Callable[[], None]) -> None:
        """DDP's comm hook sees the last gradient bucket: ``callback`` is called then."""
        self._grads_ready_callback = callback

    def _grads_ready(self) -> None:
        if self._grads_ready_callback is not None:
            self._grads_ready_callback()

    def settle_buckets(self, sync_step: Callable[[], None]) -> bool:
        """DDP reduces a launch's first synchronising backward in one provisional bucket (parameters in definition
        order), then rebuilds its buckets in the order gradients became ready. Where an element sits in a bucket
        decides the order in which the ranks' values are summed, and with three or more ranks that order changes
        the last bits. An uninterrupted run reduces every step after its first with the rebuilt buckets, so a
        resumed launch runs ``sync_step`` once first (its gradients are discarded; parameters, buffers and
        gradients are left as they were; the caller keeps the RNG) and its real steps reduce as that run's do."""
        if self.world_size == 1:
            return False  # no reduction at all
        buffers = [b.detach().clone() for b in self.model.buffers()]
        sync_step()
        with torch.no_grad():
            for b, saved in zip(self.model.buffers(), buffers, strict=True):
                b.copy_(saved)  # DDP broadcast rank 0's, and a forward may update running statistics
            torch._foreach_zero_([p.grad for p in self.params if p.grad is not None])
        return True

    def sync(self, last: bool) -> contextlib.AbstractContextManager:
        """``no_sync`` around forward and backward of every micro-step but the last."""
        return contextlib.nullcontext() if last else self.wrapped.no_sync()

    def forward(self, last: bool) -> Callable[..., torch.Tensor]:
        """The synchronising micro-step's compiled callable, or the others'."""
        return self._sync_fwd if last else self._local_fwd

    def backward(self, scaled_loss: torch.Tensor, *, first: bool, last: bool) -> None:
        """DDP's own backward on the synchronising micro-step; the others accumulate in one foreach op."""
        if last and self.world_size > 1:
            scaled_loss.backward()  # DDP's hooks all-reduce p.grad (the sum so far) during this backward
        else:
            self._accumulate(scaled_loss, first)

    def _accumulate(self, loss: torch.Tensor, first: bool) -> None:
        """Gradients of a micro-step that does not synchronise go into ``p.grad`` in one foreach op instead of
        one op per parameter (148 launches for GPT-2 small, which leave the GPU idle between them when the rest of
        the step is CUDA graphs). The first micro-step of a step copies, later ones add."""
        grads = torch.autograd.grad(loss, self.params, allow_unused=True)
        used = [(p.grad, g) for p, g in zip(self.params, grads, strict=True) if g is not None]
        if first:
            torch._foreach_copy_([acc for acc, _ in used], [g for _, g in used])
            unused = [p.grad for p, g in zip(self.params, grads, strict=True) if g is None]
            if unused:  # a parameter this micro-batch did not reach: its gradient is zero, not last step's
                torch._foreach_zero_(unused)
        else:
            torch._foreach_add_([acc for acc, _ in used], [g for _, g in used])

    def after_optimizer_step(self, optimizer: torch.optim.Optimizer, accumulation: int) -> None:
        """With one micro-step per step on several ranks, that micro-step is DDP's backward, which adds into the
        buffers: they must be zero. (Otherwise the first micro-step copies into them.)"""
        if accumulation == 1 and self.world_size > 1:
            optimizer.zero_grad(set_to_none=False)

    def state_dict(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """Every rank holds the whole model and optimizer state: rank 0's copy is the checkpoint."""
        return {"model": self.model.state_dict(), "optimizer": optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any], optimizer: torch.optim.Optimizer) -> None:
        """Load the whole model and optimizer state on every rank."""
        self.model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
