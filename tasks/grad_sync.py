"""How gradients leave a rank: DDP communication hooks, and the clipped optimizer step.

Without a hook, DDP divides every parameter's gradient by the world size in its own kernel as the gradient
becomes ready (148 small launches per step for GPT-2 small, on the critical path of the last micro-step). With
a hook DDP leaves the bucket untouched and the hook owns the averaging: NCCL averages inside the all-reduce
(``ReduceOp.AVG``, no extra kernel); other backends divide the whole bucket once, then sum.
"""

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


def folds_clipping(optimizer: torch.optim.Optimizer) -> bool:
    """True when the optimizer can apply the clip factor inside its own kernel (fused Adam/AdamW)."""
    return bool(getattr(optimizer, "_step_supports_amp_scaling", False)) and all(
        g.get("fused") for g in optimizer.param_groups)


def clipped_step(optimizer: torch.optim.Optimizer, params: list[torch.Tensor], max_norm: float | None) -> torch.Tensor:
    """Clip the gradients of ``params`` to total norm ``max_norm`` (None: no clipping), step; return the norm.

    Same result as ``clip_grad_norm_`` then ``step()``. A fused optimizer takes the clip factor as the divisor
    it already applies to every gradient for AMP (``grad_scale``), so the gradients are not rewritten in a
    separate pass; the norm stays on the device either way (no host sync).
    """
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


def add_embedding_rows(table_grad: torch.Tensor, ids: torch.Tensor, rows: torch.Tensor, world_size: int = 1,
                       group: Any = None) -> None:
    """Add an embedding lookup's gradient into its table's gradient, in place: row ``i`` of ``rows`` (shape
    ``(*ids.shape, width)``) belongs to table row ``ids[i]``; repeated ids add up.

    With ``world_size > 1`` every rank's ids and rows are gathered first and added at ``1 / world_size``: the
    same mean that DDP leaves in ``table_grad``, without all-reducing the dense vocab × width table (154 MB in
    fp32 for GPT-2) after the lookup's backward, which is the last thing the backward computes.
    """
    ids, rows = ids.reshape(-1), rows.reshape(-1, rows.shape[-1])
    if world_size > 1:
        all_ids = ids.new_empty(world_size * ids.numel())
        all_rows = rows.new_empty(world_size * rows.shape[0], rows.shape[1])
        dist.all_gather_into_tensor(all_ids, ids.contiguous(), group=group)
        dist.all_gather_into_tensor(all_rows, rows.contiguous(), group=group)
        table_grad.index_add_(0, all_ids, all_rows.to(table_grad.dtype), alpha=1.0 / world_size)
    else:
        table_grad.index_add_(0, ids, rows.to(table_grad.dtype))
