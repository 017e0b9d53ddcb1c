"""The GPT model, the gpt task's build() and its Hydra presets (CPU, seconds)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from tasks.gpt.model import GPT, lm_loss

CONF_DIR = str(Path(__file__).resolve().parents[1] / "conf")


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


# --- Hydra presets and build() ---------------------------------------------------------------------------


def _compose(*overrides: str):
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        return compose(config_name="config", overrides=list(overrides))


def test_tiny_preset_composes() -> None:
    cfg = _compose("task=gpt")
    assert cfg.task.name == "gpt"
    assert cfg.data.name == "text" and cfg.data.path is None and cfg.data.format == "auto"
    assert dict(cfg.task.model) == dict(layers=2, heads=2, width=64, context=64, vocab=256, dropout=0.0,
                                       attention="auto", loss="fused")
    assert cfg.train.optimizer == "adamw" and cfg.train.schedule == "cosine" and cfg.train.max_steps == 50


def test_gpt2_small_preset_composes() -> None:
    cfg = _compose("task=gpt2_small")
    assert cfg.task.name == "gpt"
    m = cfg.task.model
    assert (m.layers, m.heads, m.width, m.context, m.vocab) == (12, 12, 768, 1024, 50304)
    assert cfg.train.lr == 6e-4 and cfg.train.weight_decay == 0.1 and list(cfg.train.betas) == [0.9, 0.95]
    assert cfg.train.precision == "bf16" and cfg.train.compile is True and cfg.train.grad_clip == 1.0
    assert cfg.batch.per_rank == 16 and cfg.data.name == "text"
    assert cfg.train.compile_mode == "reduce-overhead"
    assert cfg.train.inductor.triton.mix_order_reduction is False and cfg.task.model.loss == "fused"


def test_build_tiny_preset(tmp_path: Path) -> None:
    from runner.contract.corpus import count_samples
    from tasks.gpt import task as gpt

    text = tmp_path / "corpus.txt"
    text.write_bytes(bytes(range(256)) * 40)  # 10240 byte tokens
    cfg = _compose("task=gpt", f"data.path={text}")
    parts = gpt.build(cfg, torch.device("cpu"))
    assert (len(parts.train_set), len(parts.val_set)) == count_samples(str(text), "auto", 64, 0.1)
    assert parts.tokens_per_sample == 64
    assert parts.flops_per_sample == parts.model.flops_per_token() * 64
    x, y = parts.train_set[0]
    loss = parts.model(x[None], y[None])
    assert abs(loss.item() - math.log(256)) < 0.3


def test_checks_refuse_data_vocab_larger_than_model(tmp_path: Path) -> None:
    from runner.contract.errors import PlanError
    from tasks.gpt.checks import check

    text = tmp_path / "corpus.txt"
    text.write_bytes(b"hello world\n" * 100)
    cfg = OmegaConf.to_container(_compose("task=gpt", f"data.path={text}", "task.model.vocab=128"))
    with pytest.raises(PlanError, match="at least 256") as e:
        check(cfg)
    assert e.value.key == "task.model.vocab"
    cfg = OmegaConf.to_container(_compose("task=gpt", "data=synthetic"))
    with pytest.raises(PlanError, match="data=text"):
        check(cfg)


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
    from tasks.gpt.model import chunked_lm_loss

    torch.manual_seed(0)
    model = GPT(vocab=97, context=16, layers=1, heads=2, width=16)
    x, y = torch.randint(0, 97, (3, 16)), torch.randint(0, 97, (3, 16))
    with torch.no_grad():
        whole = lm_loss(model(x), y)
        h = torch.randn(3, 16, 16)
        assert torch.allclose(chunked_lm_loss(h, model.head, y, rows=5), lm_loss(model.head(h), y), atol=1e-6)
        assert torch.allclose(model(x, y), whole, atol=1e-6)
