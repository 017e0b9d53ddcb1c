"""How gradients leave a rank: DDP communication hooks, and the clipped optimizer step.

Without a hook, DDP divides every parameter's gradient by the world size in its own kernel as the gradient
becomes ready (148 small launches per step for GPT-2 small, on the critical path of the last micro-step). With
a hook DDP leaves the bucket untouched and the hook owns the averaging: NCCL averages inside the all-reduce
(``ReduceOp.AVG``, no extra kernel); other backends divide the whole bucket once, then sum.
"""

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist


# No ``from __future__ import annotations`` here: DDP checks the hook's annotations as real types.
def mean_allreduce_hook(group: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: the bucket's mean over the ranks of ``group`` (None = the default group), in place."""
    group = group if group is not None else dist.group.WORLD
    buf = bucket.buffer()
    if dist.get_backend(group) == dist.Backend.NCCL:
        work = dist.all_reduce(buf, op=dist.ReduceOp.AVG, group=group, async_op=True)
    else:  # gloo has no AVG: divide first (one kernel per bucket), then sum
        buf.div_(dist.get_world_size(group))
        work = dist.all_reduce(buf, group=group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


def notify_last_bucket(hook: Callable[..., Any], notify: Callable[[], None]) -> Callable[..., Any]:
    """``hook``, calling ``notify()`` first when DDP hands it the iteration's last bucket: the moment the backward's
    last gradient exists, before its all-reduce starts (the engine's timing marks the end of backward compute
    there: tasks/engine/timing.py)."""

    def hook_and_notify(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        if bucket.is_last():
            notify()
        return hook(state, bucket)

    return hook_and_notify


def folds_clipping(optimizer: torch.optim.Optimizer) -> bool:
    """True when the optimizer can apply the clip factor inside its own kernel (fused Adam/AdamW)."""
    return bool(getattr(optimizer, "_step_supports_amp_scaling", False)) and all(
        g.get("fused") for g in optimizer.param_groups)


def _is_sharded(t: torch.Tensor) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


def clipped_step(optimizer: torch.optim.Optimizer, params: list[torch.Tensor], max_norm: float | None) -> torch.Tensor:
    """Clip the gradients of ``params`` to total norm ``max_norm`` (None: no clipping), step; return the norm.

    Same result as ``clip_grad_norm_`` then ``step()``. A fused optimizer takes the clip factor as the divisor
    it already applies to every gradient for AMP (``grad_scale``), so the gradients are not rewritten in a
    separate pass; the norm stays on the device either way (no host sync).
    """
    grads = [p.grad for p in params if p.grad is not None]
    if grads and _is_sharded(grads[0]):
        # FSDP2: each rank holds a shard of every gradient; the norm is the whole one (torchtitan's recipe).
        norm = torch.nn.utils.get_total_norm(grads)
        norm = norm.full_tensor()  # type: ignore[attr-defined]
        if max_norm:
            torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)
        optimizer.step()
        return norm
    if max_norm and not folds_clipping(optimizer):
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        optimizer.step()
        return norm
    norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
    if not max_norm:
        optimizer.step()
        return norm
    # clip_grad_norm_ multiplies by min(1, max_norm / (norm + 1e-6)); this divides by the reciprocal.
    optimizer.grad_scale = torch.clamp((norm + 1e-6) / max_norm, min=1.0)  # type: ignore[attr-defined]
    try:
        optimizer.step()
    finally:
        del optimizer.grad_scale  # type: ignore[attr-defined]
    return norm


def scaled_step(scaler: torch.amp.GradScaler, optimizer: torch.optim.Optimizer, params: list[torch.Tensor],
                max_norm: float | None) -> torch.Tensor:
    """fp16's optimizer step: unscale, clip to ``max_norm`` (None: no clipping), step through the scaler (which
    skips a step with inf/nan gradients) and update its scale; return the gradient norm."""
    scaler.unscale_(optimizer)
    norm = (torch.nn.utils.clip_grad_norm_(params, max_norm) if max_norm
            else torch.nn.utils.get_total_norm([p.grad for p in params]))
    scaler.step(optimizer)
    scaler.update()
    return norm
