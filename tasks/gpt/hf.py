"""The GPT task's weights as a Hugging Face transformers GPT-2 model folder: ``config.json``, ``model.safetensors``
(GPT-2's parameter names) and, when the data came from ``ddp-tokenize``, its tokenizer; ``export.json`` says what
the weights are. ``GPT2LMHeadModel.from_pretrained(folder)`` loads it.

The two models are the same function: pre-LN blocks, a fused q|k|v projection, GELU-tanh (GPT-2's ``gelu_new``),
LayerNorm eps 1e-5, learned positions, the LM head tied to the token embedding. GPT-2's ``Conv1D`` layers store
their weight as (in, out): ours (``nn.Linear``, (out, in)) are transposed.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

import fsspec
import torch

from ddp_runner.tasks.engine.checkpoint.weights import INFO_FILE, WEIGHTS_FILE, plain

TOKENIZER_FILE = "tokenizer.json"
TOKENS_META = "meta.json"
EOT = "<|endoftext|>"
# Ours -> GPT-2's, per block; True: a Conv1D weight (transposed).
_BLOCK = {"ln1.weight": ("ln_1.weight", False), "ln1.bias": ("ln_1.bias", False),
          "ln2.weight": ("ln_2.weight", False), "ln2.bias": ("ln_2.bias", False),
          "qkv.weight": ("attn.c_attn.weight", True), "qkv.bias": ("attn.c_attn.bias", False),
          "proj.weight": ("attn.c_proj.weight", True), "proj.bias": ("attn.c_proj.bias", False),
          "fc.weight": ("mlp.c_fc.weight", True), "fc.bias": ("mlp.c_fc.bias", False),
          "out.weight": ("mlp.c_proj.weight", True), "out.bias": ("mlp.c_proj.bias", False)}
_TOP = {"tok.weight": "transformer.wte.weight", "pos.weight": "transformer.wpe.weight",
        "ln.weight": "transformer.ln_f.weight", "ln.bias": "transformer.ln_f.bias"}


def to_hf(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our GPT's state dict under GPT-2's names (the tied LM head left out: transformers ties it on load).
    ValueError naming the first parameter that has no GPT-2 counterpart."""
    out = {}
    for k, v in weights.items():
        if k == "head.weight":
            continue
        if k in _TOP:
            out[_TOP[k]] = v
            continue
        parts = k.split(".", 2)
        if len(parts) != 3 or parts[0] != "blocks" or parts[2] not in _BLOCK:
            raise ValueError(f"parameter {k!r} has no GPT-2 counterpart: not the GPT task's model")
        name, conv = _BLOCK[parts[2]]
        out[f"transformer.h.{parts[1]}.{name}"] = v.t() if conv else v
    return out


_GPT_KEYS = {"vocab", "context", "width", "layers", "heads"}  # the task.model keys config() reads


def config(model: dict[str, Any], eot_id: int | None = None) -> Any:
    """The transformers ``GPT2Config`` of our ``task.model`` settings."""
    from transformers import GPT2Config

    p = float(model.get("dropout", 0.0) or 0.0)
    extra = {"bos_token_id": eot_id, "eos_token_id": eot_id}  # None without a tokenizer (GPT-2's 50256 otherwise)
    return GPT2Config(vocab_size=int(model["vocab"]), n_positions=int(model["context"]), n_embd=int(model["width"]),
                      n_layer=int(model["layers"]), n_head=int(model["heads"]), activation_function="gelu_new",
                      resid_pdrop=p, embd_pdrop=p, attn_pdrop=p, layer_norm_epsilon=1e-5, tie_word_embeddings=True,
                      **extra)


def tokenizer_dir(data_path: str | None) -> str | None:
    """The ``ddp-tokenize`` output folder the training data came from (its ``tokenizer.json`` and ``meta.json``
    beside the token file), or None (byte-level text, another source)."""
    if not data_path:
        return None
    folder = data_path.rstrip("/").rsplit("/", 1)[0] if "/" in data_path else "."
    fs, path = fsspec.core.url_to_fs(folder)
    ok = fs.exists(f"{path}/{TOKENIZER_FILE}") and fs.exists(f"{path}/{TOKENS_META}")
    return folder if ok else None


def _tokenizer(folder: str) -> Any:
    """``ddp-tokenize``'s tokenizer as a transformers fast tokenizer (end-of-text as BOS/EOS when it has one)."""
    from transformers import PreTrainedTokenizerFast

    with fsspec.open(f"{folder}/{TOKENIZER_FILE}", "r") as f:
        text = f.read()
    with tempfile.TemporaryDirectory() as tmp:
        local = os.path.join(tmp, TOKENIZER_FILE)
        with open(local, "w") as f:
            f.write(text)
        tok = PreTrainedTokenizerFast(tokenizer_file=local)
    if EOT in tok.get_vocab():
        tok.add_special_tokens({"bos_token": EOT, "eos_token": EOT, "unk_token": EOT})
    return tok


def write(weights: dict[str, torch.Tensor], info: dict[str, Any], out_dir: str,
          tokenizer_dir: str | None = None) -> list[str]:
    """The transformers GPT-2 folder into ``out_dir`` (a local path); returns the files written."""
    from safetensors.torch import save_file

    if not _GPT_KEYS <= set(info.get("model") or {}):  # a task of the user's own records its settings there too
        raise ValueError("the checkpoint's config has no task.model: not the GPT task's model")
    os.makedirs(out_dir, exist_ok=True)
    tok = _tokenizer(tokenizer_dir) if tokenizer_dir else None
    eot = tok.convert_tokens_to_ids(EOT) if tok is not None and EOT in tok.get_vocab() else None
    config(info["model"], eot).save_pretrained(out_dir)
    save_file(plain(to_hf(weights)), os.path.join(out_dir, WEIGHTS_FILE), metadata={"format": "pt"})
    if tok is not None:
        tok.save_pretrained(out_dir)
    with open(os.path.join(out_dir, INFO_FILE), "w") as f:
        f.write(json.dumps({**info, "hf": "GPT2LMHeadModel", "tokenizer": tok is not None}, indent=2) + "\n")
    return sorted(os.path.join(out_dir, n) for n in os.listdir(out_dir))
