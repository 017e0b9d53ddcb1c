"""Task ``gpt``'s own keys, checked by the driver before any process starts (no torch import here).

Called through ``task.checks``; each refusal names the key, the value and the fix.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ddp_runner.contract.rules import check_keys, choice, integer, number
from ddp_runner.tasks.api import ConfigError

ATTENTION = ("auto", "flash", "cudnn", "efficient")  # SDPA kernel on CUDA
LOSSES = ("fused", "plain")  # LM head + loss as one op, or logits then loss


# task.model's keys (tasks/gpt/task.py reads each of them).
RULES = (
    *(integer(f"task.model.{k}", lo=1, example=e) for k, e in
      (("layers", "2"), ("heads", "2"), ("width", "64"), ("context", "64"), ("vocab", "256"))),
    number("task.model.dropout", lo=0, hi=1, hi_open=True, null=True, example="0.1"),
    choice("task.model.attention", ATTENTION, null=True),
    choice("task.model.loss", LOSSES, null=True),
)


def check(cfg: Mapping[str, Any]) -> None:
    """Shapes, kernels and dropout of ``task.model``, and the data's vocabulary against the model's."""
    model = cfg["task"].get("model")
    if not isinstance(model, Mapping):
        raise ConfigError("task.model", model, "task=gpt needs its model settings",
                          "use a gpt task preset (task=gpt or task=gpt2_small), which sets task.model")
    for key in ("layers", "heads", "width", "context", "vocab"):
        if key not in model:
            raise ConfigError(f"task.model.{key}", None, "is missing, and the model needs it",
                              f"set task.model.{key} (see conf/task/gpt.yaml)")
    check_keys(cfg, RULES)
    if model["width"] % model["heads"]:
        raise ConfigError("task.model.width", model["width"],
                          f"not divisible by task.model.heads={model['heads']} (each head gets width/heads)",
                          f"use a width that is a multiple of {model['heads']}, or change task.model.heads")
    data = cfg.get("data") or {}
    if data.get("name") != "text":
        raise ConfigError("data", data.get("name"), "task=gpt reads a token stream",
                          "use data=text (raw text or uint16 token files)")
    from ddp_runner.contract import corpus

    need = corpus.vocab_needed(data)
    if need is not None and need.size > model["vocab"]:
        raise ConfigError("task.model.vocab", model["vocab"],
                          f"{need.why} needs a vocabulary of at least {need.size}",
                          f"set task.model.vocab >= {need.size} (e.g. {-(-need.size // 128) * 128}, a multiple of"
                          " 128), or tokenize the data with a smaller vocabulary")


def memory_facts(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """tasks/gpt/model.py's trained parameters by arithmetic, for the driver's memory planner (no torch): per
    block two LayerNorms (2·2w), qkv (3w² + 3w), the attention output (w² + w), the MLP (4w² + 4w and 4w² + w);
    outside the blocks the token and position embeddings and the final LayerNorm; the LM head is tied to the token
    embedding. A test checks this against the model built on the meta device."""
    m = cfg["task"]["model"]
    w, layers, vocab, context = m["width"], m["layers"], m["vocab"], m["context"]
    block = 12 * w * w + 13 * w
    root = vocab * w + context * w + 2 * w
    arch = {k: m[k] for k in ("layers", "width", "heads", "context", "vocab", "loss", "dropout") if k in m}
    arch.setdefault("loss", "fused")
    return {"params": layers * block + root, "largest_unit": block, "root": root, "arch": arch}
