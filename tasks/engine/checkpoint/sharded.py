"""Sharded checkpoints: every rank writes its shards with ``torch.distributed.checkpoint`` (DCP), rank 0 commits.

Layout of ``step_<N>/``: ``state.pt`` (rank 0: scheduler, progress, every rank's RNG, plan, config, and
``"sharded": SHARDS_DIR``), ``shards/`` (DCP: one file per rank and DCP's ``.metadata``), optionally ``model.pt``
(the whole model, consolidated, for inference: ``torch.load(..., weights_only=True)`` gives a plain state dict),
and ``meta.json`` last, listing every file's size. Same guarantees as the single-file checkpoints (``storage.py``
does the commit): everything is written into one temporary directory, committed by a rename only after DCP has
finished on every rank (its collective commit), so a checkpoint exists only when complete; keep-last and the
integrity check see one directory either way. DCP's metadata names each tensor by parameter name and global
shape, so a checkpoint loads at any world size (2 ranks → 1 reshards on load).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from tasks.engine.checkpoint import storage

SHARDS_DIR = "shards"
EXPORT_FILE = "model.pt"


def save(ckpt_root: str, step: int, state: dict[str, Any], shards: dict[str, Any], *, keep_last: int,
         protect: frozenset[str] = frozenset(), export: torch.nn.Module | None = None) -> str | None:
    """Write checkpoint ``step`` (collective: every rank calls it); returns its URL on rank 0, else None.

    ``state`` is rank 0's small state, ``shards`` this rank's part of model and optimizer state (from the
    strategy), ``export`` the model whose whole state dict rank 0 also saves as ``model.pt``.
    """
    import torch.distributed.checkpoint as dcp

    main = dist.get_rank() == 0
    box = [storage.stage_dir(ckpt_root, step) if main else None]
    dist.broadcast_object_list(box, src=0)  # one directory for all ranks (a shared filesystem when multinode)
    tmp = box[0]
    dcp.save(shards, checkpoint_id=f"{tmp}/{SHARDS_DIR}")  # collective; raises on every rank if one fails
    if export is not None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        full = get_model_state_dict(export, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if main:
            torch.save(full, f"{tmp}/{EXPORT_FILE}")
    url = None
    if main:
        url = storage.save(ckpt_root, step, {**state, "sharded": SHARDS_DIR}, keep_last=keep_last,
                           protect=protect, staged=tmp)
    dist.barrier()  # no rank moves on (or starts the next save) before the commit
    return url


def is_sharded(state: dict[str, Any]) -> bool:
    """Whether a loaded ``state.pt`` belongs to a sharded checkpoint."""
    return bool(state.get("sharded"))


def load_shards(url: str, state: dict[str, Any], shards: dict[str, Any]) -> None:
    """Fill ``shards`` (this rank's model and optimizer state, as the strategy shapes it) in place from the
    checkpoint at ``url`` (collective). DCP reads each rank's slices, whatever world size wrote them."""
    import torch.distributed.checkpoint as dcp

    fs_path = url.rstrip("/")
    if fs_path.endswith("/" + storage.STATE_FILE):
        fs_path = fs_path.rsplit("/", 1)[0]
    dcp.load(shards, checkpoint_id=f"{fs_path}/{state['sharded']}")
