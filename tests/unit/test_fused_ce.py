"""The fused LM head + cross-entropy op: same value and gradients as the unfused path, eager. Compiled (an inductor
compile) and its Triton kernel: tests/integration/test_fused_ce_triton.py."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ddp_runner.tasks.gpt.fused_ce import linear_cross_entropy
from ddp_runner.tasks.gpt.model import GPT


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_value_and_gradients_equal_cross_entropy(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    h = torch.randn(4, 6, 16, requires_grad=True, dtype=dtype)
    w = torch.randn(50, 16, requires_grad=True, dtype=dtype)
    t = torch.randint(0, 50, (4, 6))
    ref = F.cross_entropy((h @ w.t()).reshape(-1, 50), t.reshape(-1))
    ref_h, ref_w = torch.autograd.grad(ref / 3, (h, w))  # a non-unit incoming gradient, as with accumulation
    out = linear_cross_entropy(h, w, t)
    got_h, got_w = torch.autograd.grad(out / 3, (h, w))
    assert out.dtype == torch.float32 and got_h.dtype == got_w.dtype == dtype  # the softmax runs in float32
    torch.testing.assert_close(out, ref.float())
    torch.testing.assert_close(got_h, ref_h)
    torch.testing.assert_close(got_w, ref_w)


def test_eager_backward_makes_no_logits_sized_zeros() -> None:
    """The op's second output (the logits' gradient) has no gradient of its own: autograd must not materialise
    one. Uncompiled (FSDP's root runs the loss eagerly) that was a second logits-sized buffer at the peak."""
    from torch.utils._python_dispatch import TorchDispatchMode

    rows, vocab = 24, 50

    class Shapes(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.made: list[tuple[str, tuple[int, ...]]] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor):
                    self.made.append((str(func), tuple(t.shape)))
            return out

    h = torch.randn(rows, 16, requires_grad=True)
    w = torch.randn(vocab, 16, requires_grad=True)
    loss = linear_cross_entropy(h, w, torch.randint(0, vocab, (rows,)))
    with Shapes() as mode:
        loss.backward()
    assert h.grad is not None and w.grad is not None
    logits_sized = [(f, s) for f, s in mode.made if s == (rows, vocab)]
    assert not logits_sized, logits_sized


def test_gpt_fused_and_plain_losses_train_the_same() -> None:
    idx, tgt = torch.randint(0, 64, (3, 16)), torch.randint(0, 64, (3, 16))
    grads = []
    for loss in ("fused", "plain"):
        torch.manual_seed(0)
        model = GPT(vocab=64, context=16, width=32, layers=2, heads=4, loss=loss)
        value = model(idx, tgt)
        value.backward()
        grads.append((value.detach(), {n: p.grad for n, p in model.named_parameters()}))
        with torch.no_grad():  # evaluation takes the plain path: no gradient work
            torch.testing.assert_close(model(idx, tgt), value.detach())
    (v0, g0), (v1, g1) = grads
    torch.testing.assert_close(v0, v1)
    assert g0.keys() == g1.keys()
    for name in g0:
        torch.testing.assert_close(g0[name], g1[name], msg=name)


def test_unknown_loss_is_refused() -> None:
    with pytest.raises(ValueError, match="loss"):
        GPT(vocab=8, context=4, width=8, layers=1, heads=1, loss="chunky")


def test_bf16_gradients_carry_no_scale_rounding() -> None:
    # The incoming gradient (1/accumulation) / rows is applied in float32: rounded to bf16, 1/3 would scale
    # every gradient by 1.0029 (a bias, not noise, so it shows in the least-squares ratio to the exact one).
    torch.manual_seed(0)
    h32, w32 = torch.randn(512, 64), 0.2 * torch.randn(300, 64)
    t = torch.randint(0, 300, (512,))
    h, w = h32.bfloat16().requires_grad_(), w32.bfloat16().requires_grad_()
    got_h, got_w = torch.autograd.grad(linear_cross_entropy(h, w, t) / 3, (h, w))
    hr, wr = h.detach().float().requires_grad_(), w.detach().float().requires_grad_()
    ref_h, ref_w = torch.autograd.grad(F.cross_entropy(hr @ wr.t(), t) / 3, (hr, wr))
    for got, ref in ((got_h, ref_h), (got_w, ref_w)):
        ratio = (got.float() * ref).sum() / (ref * ref).sum()
        assert abs(ratio.item() - 1) < 5e-4, ratio.item()
