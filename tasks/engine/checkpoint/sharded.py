"""Sharded checkpoints: every rank writes its shards with ``torch.distributed.checkpoint`` (DCP), rank 0 commits.

Layout of ``step_<N>/``: ``state.pt`` (rank 0: scheduler, progress, every rank's RNG, plan, config, and
``"sharded": SHARDS_DIR``), ``shards/`` (DCP: one file per rank and DCP's ``.metadata``), optionally ``model.pt``
(the whole model, consolidated, for inference: ``torch.load(..., weights_only=True)`` gives a plain state dict),
and ``meta.json`` last, listing every file's size. Same guarantees as the single-file checkpoints (``storage.py``
does the commit): on a local or shared filesystem everything is written into one temporary directory, committed
by a rename only after DCP has finished on every rank (its collective commit); on an object store (``s3://``)
every rank writes its shards straight into ``step_<N>/shards/`` through DCP's fsspec writer and rank 0 writes
``meta.json`` last, after a barrier, so a checkpoint exists only when complete either way; keep-last and the
integrity check see one directory. DCP's metadata names each tensor by parameter name and global shape, so a
checkpoint loads at any world size (2 ranks → 1 reshards on load).
"""

from __future__ import annotations

from typing import Any

import fsspec
import torch
import torch.distributed as dist

from ddp_runner.tasks.engine.checkpoint import storage

SHARDS_DIR = "shards"
EXPORT_FILE = "model.pt"


def save(ckpt_root: str, step: int, state: dict[str, Any], shards: dict[str, Any], *, keep_last: int,
         protect: frozenset[str] = frozenset(), export: torch.nn.Module | None = None,
         hooks: storage.SaveHooks | None = None) -> str | None:
    """Write checkpoint ``step`` (collective: every rank calls it); returns its URL on rank 0, else None.

    ``state`` is rank 0's small state, ``shards`` this rank's part of model and optimizer state (from the
    strategy), ``export`` the model whose whole state dict rank 0 also saves as ``model.pt``, ``hooks`` what rank
    0's commit calls before the marker (:func:`storage.save`).
    """
    import torch.distributed.checkpoint as dcp

    main = dist.get_rank() == 0
    box = [storage.stage_dir(ckpt_root, step) if main else None]
    dist.broadcast_object_list(box, src=0)  # one directory for all ranks (shared or a bucket when multinode)
    tmp = box[0]
    target = f"{tmp}/{SHARDS_DIR}"
    if storage.is_local(target):
        dcp.save(shards, checkpoint_id=target)  # collective; raises on every rank if one fails
    else:
        dcp.save(shards, storage_writer=_remote_writer(target))
    if export is not None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        full = get_model_state_dict(export, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if main:
            with fsspec.open(f"{tmp}/{EXPORT_FILE}", "wb") as f:
                torch.save(full, f)
    # DCP's collective finish already waited for every rank's writes; the barrier makes "every shard exists
    # before rank 0 lists them for meta.json" hold whatever DCP does internally.
    dist.barrier()
    url = None
    if main:
        url = storage.save(ckpt_root, step, {**state, "sharded": SHARDS_DIR}, keep_last=keep_last,
                           protect=protect, staged=tmp, hooks=hooks)
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
    source = f"{fs_path}/{state['sharded']}"
    if storage.is_local(source):
        dcp.load(shards, checkpoint_id=source)
    else:
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader  # not re-exported (torch 2.13)

        dcp.load(shards, storage_reader=FsspecReader(source))


def _remote_writer(url: str) -> Any:
    """DCP's fsspec writer for an object-store URL."""
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

    # No fsync there: an object exists once its upload completed, and DCP's fallback for a stream without a
    # file descriptor is os.sync() of the whole host after every file.
    return FsspecWriter(url, sync_files=False)
