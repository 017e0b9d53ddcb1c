"""Every RNG a rank draws from, captured and restored, so a resumed run draws exactly what it would have."""

from __future__ import annotations

import random
from typing import Any

import torch


def rng_state() -> dict:
    """RNG states of python ``random``, numpy's global generator, torch CPU and the current CUDA device.

    Everything is stored as ints, tuples, lists and tensors, so it round-trips through ``weights_only`` loads.
    Only the current CUDA device is captured: ``get_rng_state_all`` would create a context on every visible
    GPU in every rank.
    """
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy is optional
        pass
    else:
        kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
        state["numpy"] = {"kind": str(kind), "keys": torch.from_numpy(keys.astype("int64")), "pos": int(pos),
                          "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict) -> None:
    """Restore what :func:`rng_state` captured (keys that are absent are left alone)."""
    if "python" in state:
        version, internal, gauss = state["python"]
        random.setstate((version, tuple(internal), gauss))
    if "torch" in state:
        torch.set_rng_state(state["torch"].cpu())
    if "numpy" in state:
        import numpy as np

        n = state["numpy"]
        keys = np.asarray(n["keys"].cpu().numpy() if isinstance(n["keys"], torch.Tensor) else n["keys"])
        np.random.set_state((n["kind"], keys.astype(np.uint32), n["pos"], n["has_gauss"],
                             n["cached_gaussian"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"].cpu())
