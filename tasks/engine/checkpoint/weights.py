"""Weights as files hold them: the model's own parameter names (no wrapper prefixes) and plain tensors, and the
names of the files an export writes (tasks/engine/checkpoint/export.py, tasks/gpt/hf.py)."""

from __future__ import annotations

import torch

WEIGHTS_FILE = "model.safetensors"
INFO_FILE = "export.json"
# Prefixes a wrapped model puts before its parameters' names (DDP's module, torch.compile's original module).
_WRAPPER_PREFIXES = ("module.", "_orig_mod.")


def clean_names(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The model's own parameter names, without the prefixes wrappers add."""
    out = {}
    for k, v in weights.items():
        for p in _WRAPPER_PREFIXES:
            while k.startswith(p):
                k = k[len(p):]
        out[k] = v
    return out


def plain(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Contiguous CPU tensors, each its own storage (safetensors refuses shared ones; tied weights are copied)."""
    out, seen = {}, set()
    for k, v in weights.items():
        v = v.detach().to("cpu").contiguous()
        key = (v.untyped_storage().data_ptr(), v.storage_offset())
        out[k] = v.clone() if key in seen else v
        seen.add(key)
    return out
