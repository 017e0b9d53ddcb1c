"""The GPT model, the gpt task's build() and its Hydra presets (CPU, seconds)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from ddp_runner.tasks.gpt.model import GPT, lm_loss


def tiny(**kw) -> GPT:
    args = dict(vocab=64, context=16, width=32, layers=2, heads=4)
    args.update(kw)
    return GPT(**args)


def test_forward_shapes_and_initial_loss() -> None:
    torch.manual_seed(0)
    model = tiny()
    idx = torch.randint(0, 64, (3, 16))
    logits = model(idx)
    assert logits.shape == (3, 16, 64)
    loss = model(idx, torch.randint(0, 64, (3, 16)))
    assert loss.shape == () and loss.dtype == torch.float32
    # Small init: predictions start near uniform, so the loss starts near ln(vocab).
    assert abs(loss.item() - math.log(64)) < 0.3
    # Shorter sequences than the context are fine, longer ones are refused.
    assert model(idx[:, :5]).shape == (3, 5, 64)
    with pytest.raises(ValueError, match="exceeds the model context"):
        model(torch.zeros(1, 17, dtype=torch.long))


def test_gpt2_small_param_count_and_flops_on_meta() -> None:
    with torch.device("meta"):
        model = GPT(vocab=50304, context=1024, width=768, layers=12, heads=12)
    n = model.num_params()
    assert 123e6 < n < 125e6, n
    assert model.num_params(exclude_position=False) == n + 1024 * 768
    assert model.flops_per_token() == 6 * n + 12 * 12 * 768 * 1024


def test_head_is_tied_to_token_embedding() -> None:
    model = tiny()
    assert model.head.weight is model.tok.weight
    assert model.head.bias is None
    # Counted once: vocab*width appears a single time in the parameter count.
    distinct = {id(p) for p in model.parameters()}
    assert len(distinct) == len(list(model.parameters()))


def test_gpt2_init_scales_residual_projections() -> None:
    torch.manual_seed(0)
    model = GPT(vocab=128, context=32, width=256, layers=8, heads=4)
    assert model.blocks[0].qkv.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert model.blocks[0].proj.weight.std().item() == pytest.approx(0.02 / math.sqrt(16), rel=0.05)
    assert model.blocks[0].out.weight.std().item() == pytest.approx(0.02 / math.sqrt(16), rel=0.05)
    assert torch.count_nonzero(model.blocks[0].qkv.bias) == 0


def test_invalid_shapes_are_refused() -> None:
    with pytest.raises(ValueError, match="divisible"):
        GPT(vocab=64, context=8, width=30, layers=1, heads=4)


def test_loss_falls_with_adamw_on_a_fixed_batch() -> None:
    torch.manual_seed(0)
    model = tiny()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    tokens = torch.randint(0, 64, (4, 17))
    x, y = tokens[:, :-1], tokens[:, 1:]
    first = None
    for _ in range(30):
        loss = model(x, y)
        first = loss.item() if first is None else first
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    assert loss.item() < 0.6 * first, (first, loss.item())


def test_bf16_autocast_on_cpu() -> None:
    torch.manual_seed(0)
    model = tiny()
    idx = torch.randint(0, 64, (2, 16))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(idx)
        loss = model(idx, idx)
    assert logits.dtype == torch.bfloat16
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def test_dropout_is_configurable() -> None:
    torch.manual_seed(0)
    model = tiny(dropout=0.5)
    idx = torch.randint(0, 64, (2, 16))
    model.train()
    assert not torch.equal(model(idx), model(idx))
    model.eval()
    assert torch.equal(model(idx), model(idx))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_lm_loss_equals_float32_cross_entropy_in_value_and_gradient(dtype):
    g = torch.Generator().manual_seed(3)
    logits = (4 * torch.randn(3, 7, 301, generator=g)).to(dtype).requires_grad_()
    targets = torch.randint(0, 301, (3, 7), generator=g)
    ours = lm_loss(logits, targets)
    (ours_grad,) = torch.autograd.grad(ours, logits)
    ref = F.cross_entropy(logits.float().view(-1, 301), targets.view(-1))
    (ref_grad,) = torch.autograd.grad(ref, logits)
    assert ours.dtype == torch.float32
    torch.testing.assert_close(ours, ref, rtol=1e-6, atol=1e-6)
    assert ours_grad.dtype == dtype
    torch.testing.assert_close(ours_grad.float(), ref_grad.float(), rtol=1e-5, atol=1e-7)


def test_validation_loss_in_chunks_equals_the_whole_batch_loss() -> None:
    """Without gradients (validation) the loss is made a few rows of logits at a time: same value."""
    from ddp_runner.tasks.gpt.model import chunked_lm_loss

    torch.manual_seed(0)
    model = GPT(vocab=97, context=16, layers=1, heads=2, width=16)
    x, y = torch.randint(0, 97, (3, 16)), torch.randint(0, 97, (3, 16))
    with torch.no_grad():
        whole = lm_loss(model(x), y)
        h = torch.randn(3, 16, 16)
        assert torch.allclose(chunked_lm_loss(h, model.head, y, rows=5), lm_loss(model.head(h), y), atol=1e-6)
        assert torch.allclose(model(x, y), whole, atol=1e-6)
