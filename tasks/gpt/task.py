"""Task ``gpt``: a GPT-2-style language model trained on a token stream (``data: text``).

Config: ``task.model.{layers, heads, width, context, vocab, dropout}`` and the ``data`` group (``path``,
``format``, ``val_fraction``, optional ``vocab``). See ``conf/task/gpt.yaml`` (tiny, CPU) and
``conf/task/gpt2_small.yaml`` (124M).
"""

from __future__ import annotations

import torch

from ddp_runner.tasks.api import Config, TaskParts
from ddp_runner.tasks.gpt.checks import ATTENTION
from ddp_runner.tasks.gpt.data import make_datasets
from ddp_runner.tasks.gpt.model import GPT


def choose_attention(kind: str) -> None:
    """Restrict SDPA to one CUDA attention kernel (``auto`` leaves PyTorch's own choice).

    The flags are read when the attention call is traced or run, so this holds under torch.compile too.
    """
    if kind not in ATTENTION:
        raise ValueError(f"task.model.attention={kind!r}: unknown kernel. Fix: use one of {', '.join(ATTENTION)}")
    if kind == "auto":
        return
    torch.backends.cuda.enable_flash_sdp(kind == "flash")
    torch.backends.cuda.enable_cudnn_sdp(kind == "cudnn")
    torch.backends.cuda.enable_mem_efficient_sdp(kind == "efficient")
    torch.backends.cuda.enable_math_sdp(False)


def build(cfg: Config, device: torch.device) -> TaskParts:
    """Build the GPT model on ``device`` and its (train, val) text datasets.

    The driver checked the keys and the data's vocabulary before launch (``tasks/gpt/checks.py``); every sample
    still checks its ids against the model's vocabulary.
    """
    m = cfg.task.model
    if device.type == "cuda":
        choose_attention(m.get("attention", "auto"))
    # Build straight on the device: a 124M model initialised on GPU does not wait on CPU RNG and a copy.
    with torch.device(device):
        model = GPT(
            vocab=int(m.vocab),
            context=int(m.context),
            width=int(m.width),
            layers=int(m.layers),
            heads=int(m.heads),
            dropout=float(m.get("dropout", 0.0)),
            loss=str(m.get("loss", "fused")),
        )
    # uint16 streams carry no vocabulary of their own: every sample checks its ids against the model's.
    train, val = make_datasets(cfg.data, int(m.context), max_token=int(m.vocab))
    return TaskParts(
        model=model,
        train_set=train,
        val_set=val,
        flops_per_sample=model.flops_per_token() * int(m.context),
        tokens_per_sample=int(m.context),
    )
