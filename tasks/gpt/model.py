"""A GPT-2-style decoder-only transformer language model.

Token + learned position embeddings, pre-LayerNorm blocks (fused qkv projection, causal
``scaled_dot_product_attention`` so CUDA picks flash/memory-efficient kernels, 4x GELU-tanh MLP), a final
LayerNorm and an LM head tied to the token embedding. GPT-2 initialisation. Same structure as the
hand-written baseline in ``shared/reference/gpt_ddp_reference.py``, so it runs at least as fast; dropout
modules are left out entirely at ``dropout=0`` rather than run as no-ops.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from ddp_runner.tasks.gpt.checks import LOSSES
from ddp_runner.tasks.gpt.fused_ce import linear_cross_entropy


def _dropout(p: float) -> nn.Module:
    return nn.Dropout(p) if p > 0 else nn.Identity()


class Block(nn.Module):
    """One pre-LN transformer block: ``x + attn(ln1(x))``, then ``x + mlp(ln2(x))``."""

    def __init__(self, width: int, heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.fc = nn.Linear(width, 4 * width)
        self.out = nn.Linear(4 * width, width)
        self.resid_drop = _dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        x = x + self.resid_drop(self.proj(y.transpose(1, 2).reshape(b, t, c)))
        return x + self.resid_drop(self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh")))


class GPT(nn.Module):
    """Decoder-only transformer LM; ``forward(idx, targets)`` returns the mean next-token cross-entropy."""

    def __init__(
        self,
        vocab: int = 50304,
        context: int = 1024,
        width: int = 768,
        layers: int = 12,
        heads: int = 12,
        dropout: float = 0.0,
        loss: str = "fused",
    ) -> None:
        super().__init__()
        if loss not in LOSSES:
            raise ValueError(f"loss must be one of {LOSSES}; got {loss!r}")
        self.loss = loss
        if width % heads:
            raise ValueError(f"width {width} must be divisible by heads {heads}")
        if min(vocab, context, width, layers, heads) < 1:
            raise ValueError("vocab, context, width, layers and heads must all be >= 1")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1); got {dropout}")
        self.vocab, self.context, self.width, self.layers, self.heads = vocab, context, width, layers, heads
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Embedding(context, width)
        self.drop = _dropout(dropout)
        self.blocks = nn.ModuleList(Block(width, heads, dropout) for _ in range(layers))
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.tok.weight  # tied: one matrix embeds and un-embeds
        self._init_weights()

    def _init_weights(self) -> None:
        """GPT-2 init: N(0, 0.02) weights, zero biases; residual output projections scaled by 1/sqrt(2L)."""
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)
        # Each block adds two outputs to the residual stream; scaling keeps its variance flat with depth.
        resid_std = 0.02 / math.sqrt(2 * self.layers)
        for blk in self.blocks:
            nn.init.normal_(blk.proj.weight, mean=0.0, std=resid_std)
            nn.init.normal_(blk.out.weight, mean=0.0, std=resid_std)

    def num_params(self, exclude_position: bool = True) -> int:
        """Parameter count (tied weights once); without position embeddings by default, as in FLOP counts."""
        n = sum(p.numel() for p in self.parameters())
        return n - self.pos.weight.numel() if exclude_position else n

    def flops_per_token(self) -> float:
        """Training FLOPs per token (forward + backward) at full context: ``6N + 12·L·d·T`` (PaLM appendix B).

        ``6N`` covers the weight matmuls, ``12·L·d·T`` the attention score and value matmuls.
        """
        return 6 * self.num_params() + 12 * self.layers * self.width * self.context

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """Mean cross-entropy of ``targets`` given ``idx`` (both ``(B, T)`` int64, ``T <= context``).

        Logits are upcast to float32 before the loss, so bf16 autocast does not degrade the softmax. With
        ``targets=None`` returns the ``(B, T, vocab)`` logits instead. With ``loss="fused"`` and gradients on,
        the LM head and the loss are one op that turns the logits into their gradient during the forward
        (``tasks.fused_ce``); the value and the gradients are the same.
        """
        t = idx.shape[1]
        if t > self.context:
            raise ValueError(f"sequence length {t} exceeds the model context {self.context}")
        x = self.drop(self.tok(idx) + self.pos(torch.arange(t, device=idx.device)))
        for blk in self.blocks:
            x = blk(x)
        h = self.ln(x)
        if targets is not None and self.loss == "fused" and torch.is_grad_enabled():
            return linear_cross_entropy(h, self.head.weight, targets)
        if targets is not None and not torch.is_grad_enabled() and not torch.compiler.is_compiling():
            return chunked_lm_loss(h, self.head, targets)
        logits = self.head(h)
        if targets is None:
            return logits
        return lm_loss(logits, targets)


def chunked_lm_loss(hidden: torch.Tensor, head: nn.Module, targets: torch.Tensor, rows: int = 4096) -> torch.Tensor:
    """:func:`lm_loss` of ``head(hidden)`` without the whole logits at once: ``rows`` tokens at a time (validation,
    uncompiled, e.g. under FSDP, whose root runs eagerly: the float32 logits of a whole batch would outgrow the
    training step's peak)."""
    flat, tgt = hidden.reshape(-1, hidden.size(-1)), targets.reshape(-1)
    total = torch.zeros((), dtype=torch.float32, device=hidden.device)
    for start in range(0, flat.size(0), rows):
        logits = head(flat[start:start + rows]).float()
        picked = logits.gather(1, tgt[start:start + rows, None]).squeeze(1)
        total += (torch.logsumexp(logits, dim=-1) - picked).sum()
    return total / flat.size(0)


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy, computed in float32 from (possibly bf16) ``logits``.

    Equal to ``F.cross_entropy(logits.float(), targets)``, written as ``mean(logsumexp) + nll`` so that under
    torch.compile the backward keeps only the logits and one float per row: the softmax is recomputed from
    the logits in the same kernel that writes their gradient. (``cross_entropy`` saves its float32
    log-softmax, twice the bytes of bf16 logits, and reads it back.)
    """
    flat = logits.reshape(-1, logits.size(-1)).float()
    return torch.logsumexp(flat, dim=-1).mean() + F.nll_loss(flat, targets.reshape(-1))
