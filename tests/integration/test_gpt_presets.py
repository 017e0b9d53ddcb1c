"""The GPT model, the gpt task's build() and its Hydra presets (CPU, seconds)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

CONF_DIR = str(Path(__file__).resolve().parents[2] / "conf")


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
    from ddp_runner.contract.corpus import count_samples
    from ddp_runner.tasks.gpt import task as gpt

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
    from ddp_runner.contract.errors import PlanError
    from ddp_runner.tasks.gpt.checks import check

    text = tmp_path / "corpus.txt"
    text.write_bytes(b"hello world\n" * 100)
    cfg = OmegaConf.to_container(_compose("task=gpt", f"data.path={text}", "task.model.vocab=128"))
    with pytest.raises(PlanError, match="at least 256") as e:
        check(cfg)
    assert e.value.key == "task.model.vocab"
    cfg = OmegaConf.to_container(_compose("task=gpt", "data=synthetic"))
    with pytest.raises(PlanError, match="data=text"):
        check(cfg)
