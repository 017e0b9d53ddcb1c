"""Task ``gpt``'s own keys, checked by the driver before any process starts (no torch import here).

Called through ``task.checks``; each refusal names the key, the value and the fix.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tasks.api import ConfigError

ATTENTION = ("auto", "flash", "cudnn", "efficient")  # SDPA kernel on CUDA
LOSSES = ("fused", "plain")  # LM head + loss as one op, or logits then loss


def _positive(model: Mapping[str, Any], key: str) -> int:
    value = model.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"task.model.{key}", value, "must be a positive integer",
                          f"set task.model.{key} to a positive whole number")
    return value


def check(cfg: Mapping[str, Any]) -> None:
    """Shapes, kernels and dropout of ``task.model``, and the data's vocabulary against the model's."""
    model = cfg["task"].get("model")
    if not isinstance(model, Mapping):
        raise ConfigError("task.model", model, "task=gpt needs its model settings",
                          "use a gpt task preset (task=gpt or task=gpt2_small), which sets task.model")
    for key in ("layers", "heads", "width", "context", "vocab"):
        _positive(model, key)
    if model["width"] % model["heads"]:
        raise ConfigError("task.model.width", model["width"],
                          f"not divisible by task.model.heads={model['heads']} (each head gets width/heads)",
                          f"use a width that is a multiple of {model['heads']}, or change task.model.heads")
    dropout = model.get("dropout", 0.0)
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0.0 <= dropout < 1.0:
        raise ConfigError("task.model.dropout", dropout, "must be a number in [0, 1)", "e.g. task.model.dropout=0.1")
    for key, allowed in (("attention", ATTENTION), ("loss", LOSSES)):
        value = model.get(key)
        if value is not None and value not in allowed:
            raise ConfigError(f"task.model.{key}", value, "unknown value", f"use one of {', '.join(allowed)}")
    data = cfg.get("data") or {}
    if data.get("name") != "text":
        raise ConfigError("data", data.get("name"), "task=gpt reads a token stream",
                          "use data=text (raw text or uint16 token files)")
    from runner import corpus

    need = corpus.vocab_needed(data)
    if need is not None and need.size > model["vocab"]:
        raise ConfigError("task.model.vocab", model["vocab"],
                          f"{need.why} needs a vocabulary of at least {need.size}",
                          f"set task.model.vocab >= {need.size} (e.g. {-(-need.size // 128) * 128}, a multiple of"
                          " 128), or tokenize the data with a smaller vocabulary")
