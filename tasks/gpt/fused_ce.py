"""LM head and cross-entropy in one op: the loss *and* the gradient of the logits come out of the forward.

The unfused path writes the (tokens × vocab) logits, reads them in one kernel for the loss, and in the
backward reads them again in another kernel that writes their gradient; for GPT-2 small at micro-batch 16 the
bf16 logits are 1.65 GB. Here one matmul writes the logits and one kernel, still in the forward, reads each
row, writes its loss and overwrites the row in place with ``softmax - onehot`` (the gradient of the row's
loss). The backward is then just the two matmuls on that buffer, ``d hidden = G @ W`` and
``d W = Gᵀ @ hidden``, scaled by the incoming gradient / rows. (Making the logits in chunks of rows, small
enough to stay in L2 for the kernel, measured slower on an H200: BENCHMARKS.md.)

The value and both gradients equal ``F.cross_entropy(hidden @ W.T, targets)`` (float32 softmax; the logits
and their gradient are held in ``hidden``'s dtype, as in the unfused bf16 path). Every target must be a valid
class index (no ``ignore_index``).

It is a ``torch.library`` custom op, so torch.compile keeps it whole (one opaque call inside the compiled
graph) and CUDA graphs capture it. On CUDA with Triton the in-place kernel is a Triton kernel; elsewhere the
same arithmetic runs as PyTorch ops.
"""

from __future__ import annotations

import importlib.util

import torch

_TRITON = importlib.util.find_spec("triton") is not None
_kernel = None  # the Triton kernel, compiled on first CUDA use
# Launch shape: one row per program, BLOCK columns per iteration over NUM_WARPS warps (bench/loss_bench.py).
BLOCK, NUM_WARPS = 8192, 32


def _triton_kernel():
    """Define the Triton kernel on first use (importing triton costs time and needs a GPU build)."""
    global _kernel
    if _kernel is not None:
        return _kernel
    import triton
    import triton.language as tl

    @triton.jit
    def ce_rows_inplace(logits_ptr, targets_ptr, losses_ptr, row_stride, n_cols, BLOCK: tl.constexpr):
        # One program per row. Pass 1: each lane keeps its own running max m and sum s of exp(x - m), with one
        # exp per element (exp(-|x - m|) serves both branches) and no cross-lane reduction until the end.
        # Pass 2: overwrite the row with softmax - onehot. Wide programs (few rows in flight) give pass 2 a
        # chance to find its row still in L2.
        row = tl.program_id(0).to(tl.int64)
        ptr = logits_ptr + row * row_stride
        cols = tl.arange(0, BLOCK)
        m = tl.full([BLOCK], float("-inf"), tl.float32)
        s = tl.zeros([BLOCK], tl.float32)
        for start in range(0, n_cols, BLOCK):
            idx = start + cols
            x = tl.load(ptr + idx, mask=idx < n_cols, other=float("-inf")).to(tl.float32)
            bigger = x > m
            d = tl.exp(tl.where(bigger, m - x, x - m))  # exp(-inf) = 0 covers the first element and padding
            d = tl.where(x == float("-inf"), 0.0, d)  # padding: -inf - (-inf) is nan
            s = tl.where(bigger, s * d + 1.0, s + d)
            m = tl.maximum(m, x)
        m_row = tl.max(m, axis=0)
        s_row = tl.sum(tl.where(m == float("-inf"), 0.0, s * tl.exp(m - m_row)), axis=0)
        lse = m_row + tl.log(s_row)
        t = tl.load(targets_ptr + row)
        x_t = tl.load(ptr + t).to(tl.float32)  # read before pass 2 overwrites it
        tl.store(losses_ptr + row, lse - x_t)
        for start in range(0, n_cols, BLOCK):
            idx = start + cols
            mask = idx < n_cols
            x = tl.load(ptr + idx, mask=mask, other=0.0).to(tl.float32)
            p = tl.exp(x - lse)
            p = tl.where(idx == t, p - 1.0, p)
            tl.store(ptr + idx, p.to(ptr.dtype.element_ty), mask=mask)

    _kernel = ce_rows_inplace
    return _kernel


def _ce_inplace_torch(logits: torch.Tensor, targets: torch.Tensor, losses: torch.Tensor) -> None:
    """The kernel's arithmetic in PyTorch ops (CPU, or CUDA without Triton)."""
    x = logits.float()
    lse = torch.logsumexp(x, dim=-1)
    losses.copy_(lse - x.gather(1, targets[:, None]).squeeze(1))
    p = torch.exp(x - lse[:, None])
    p.scatter_add_(1, targets[:, None], torch.full_like(lse[:, None], -1.0))
    logits.copy_(p)


@torch.library.custom_op("ddp_runner::linear_ce", mutates_args=())
def _linear_ce(hidden: torch.Tensor, weight: torch.Tensor,
               targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    rows, vocab = hidden.shape[0], weight.shape[0]
    grad_logits = torch.mm(hidden, weight.t())  # the logits, about to become their own gradient
    losses = torch.empty(rows, dtype=torch.float32, device=hidden.device)
    if _TRITON and hidden.is_cuda:
        _triton_kernel()[(rows,)](grad_logits, targets, losses, grad_logits.stride(0), vocab,
                                  BLOCK=BLOCK, num_warps=NUM_WARPS)
    else:
        _ce_inplace_torch(grad_logits, targets, losses)
    return losses.mean(), grad_logits


@_linear_ce.register_fake
def _(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return (hidden.new_empty((), dtype=torch.float32),
            hidden.new_empty((hidden.shape[0], weight.shape[0])))


def _setup_context(ctx, inputs, output) -> None:
    hidden, weight, _ = inputs
    _, grad_logits = output
    ctx.save_for_backward(hidden, weight, grad_logits)
    ctx.mark_non_differentiable(grad_logits)
    # Else autograd hands the backward a zero tensor the size of the logits for the unused output (eager only:
    # a compiled graph drops it), a second logits-sized buffer at the peak (bench/memory_peak.py).
    ctx.set_materialize_grads(False)


def _backward(ctx, grad_loss: torch.Tensor, _unused: torch.Tensor | None):
    hidden, weight, grad_logits = ctx.saved_tensors
    scale = grad_loss.float() / grad_logits.shape[0]  # d mean / d row loss, kept in float32 (1/3 is not a bf16)
    grad_hidden = ((grad_logits @ weight).float() * scale).to(hidden.dtype)
    grad_weight = ((grad_logits.t() @ hidden).float() * scale).to(weight.dtype)
    return grad_hidden, grad_weight, None


_linear_ce.register_autograd(_backward, setup_context=_setup_context)


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of ``targets`` under logits ``hidden @ weight.T``; the backward needs no logits.

    ``hidden`` is ``(..., d)``, ``weight`` ``(vocab, d)``, ``targets`` ``(...)`` of class indices. Under
    autocast both operands are cast to the autocast dtype first, as ``F.linear`` would be.
    """
    dev = hidden.device.type
    if torch.is_autocast_enabled(dev):
        dtype = torch.get_autocast_dtype(dev)
        hidden, weight = hidden.to(dtype), weight.to(dtype)
    else:
        weight = weight.to(hidden.dtype)
    flat = hidden.reshape(-1, hidden.shape[-1]).contiguous()
    with torch.autocast(dev, enabled=False):
        loss, _ = torch.ops.ddp_runner.linear_ce(flat, weight, targets.reshape(-1).contiguous())
    return loss
