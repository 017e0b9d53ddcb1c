"""The clipped optimizer step and the DDP averaging hook (tasks/grad_sync.py), on the CPU with real gloo."""

from __future__ import annotations

import pytest
import torch

from ddp_runner.tasks.engine.strategy import grad_sync


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))


def _adamw(model: torch.nn.Module, **kw) -> torch.optim.AdamW:
    # A large eps makes the update depend on the gradient's scale, so clipping shows in the parameters
    # (with a tiny eps Adam is nearly scale-free and an unclipped step would look the same).
    return torch.optim.AdamW(model.parameters(), lr=0.1, eps=0.1, weight_decay=0.1, **kw)


@pytest.mark.parametrize("max_norm", [0.05, 100.0, None])
def test_fused_clipped_step_equals_clip_grad_norm_then_step(max_norm):
    ours, ref = _model(), _model()
    opt, ref_opt = _adamw(ours, fused=True), _adamw(ref, foreach=False)
    assert grad_sync.folds_clipping(opt) and not grad_sync.folds_clipping(ref_opt)
    clipped = 0
    for _ in range(4):
        x = torch.randn(32, 8)
        for m in (ours, ref):
            m.zero_grad()
            (10 * m(x).pow(2).mean()).backward()
        norm = grad_sync.clipped_step(opt, list(ours.parameters()), max_norm)
        ref_norm = grad_sync.clipped_step(ref_opt, list(ref.parameters()), max_norm)  # clip_grad_norm_, step
        assert norm.item() == pytest.approx(ref_norm.item(), rel=1e-6)
        clipped += bool(max_norm) and norm.item() > max_norm
        assert not hasattr(opt, "grad_scale"), "the clip factor does not leak into the next step"
        for p, q in zip(ours.parameters(), ref.parameters(), strict=True):
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    assert clipped == (4 if max_norm == 0.05 else 0)


def test_clipping_changes_the_step_here():
    # The comparison above could not tell a clipped step from an unclipped one if clipping had no effect.
    a, b = _model(), _model()
    oa, ob = _adamw(a, fused=True), _adamw(b, fused=True)
    x = torch.randn(32, 8)
    for m in (a, b):
        (10 * m(x).pow(2).mean()).backward()
    grad_sync.clipped_step(oa, list(a.parameters()), 0.05)
    grad_sync.clipped_step(ob, list(b.parameters()), None)
    assert max((p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters(), strict=True)) > 1e-3
