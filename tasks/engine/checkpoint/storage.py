"""Checkpoint storage on any fsspec URL (local path, ``memory://``, ``s3://``): rank-zero side only.

Layout: ``<ckpt_root>/step_<N>/state.pt`` (``torch.save`` payload) plus ``meta.json``, the commit marker,
written LAST. A checkpoint counts (is listed, is loadable) only when its ``meta.json`` exists and is valid.

- Local filesystems: everything is written under a temporary sibling ``step_<N>.tmp-<hex>``, fsynced, and then
  renamed to ``step_<N>``, so the final name only ever appears complete.
- Object stores (and ``memory://``), which have no atomic rename: written straight into ``step_<N>/`` with
  ``meta.json`` last; a crash leaves a directory without ``meta.json``, which is never listed and is
  cleaned up.

A sharded save (``sharded.py``) has every rank write its files into the directory :func:`stage_dir` gives (the
temporary sibling locally, ``step_<N>/`` itself on an object store) before rank 0 commits it the same way, with
every file's size in ``meta.json``.

The engine gathers the state dict and calls this module from global rank 0 only; collectives and barriers
are the engine's business, not this module's.

What counts as complete and intact (the marker's fields, sizes, sha256) is the rule the driver applies too:
``runner/contract/checkpoints.py``. A save calls one hook point, :meth:`SaveHooks.before_commit`, when the caller
passes hooks (the checkpoint tests hold a save there: ``tasks/engine/diagnostics/faults.py``).

This module saves; ``listing.py`` lists and removes (retention, cleanup), ``loading.py`` loads and verifies,
``paths.py`` names the files and URLs. Callers import all of it from here.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

import fsspec
import torch

from ddp_runner.tasks.engine.checkpoint.listing import (
    apply_retention,
    cleanup_partial,
    is_checkpoint,
    latest,
    list_complete,
    list_skipped,
    remove_dir,
)
from ddp_runner.tasks.engine.checkpoint.loading import load, load_first_good
from ddp_runner.tasks.engine.checkpoint.paths import (
    FORMAT,
    META_FILE,
    STATE_FILE,
    CheckpointError,
    fs_of,
    fsync_dir,
    is_local,
    is_local_fs,
    join_url,
    step_dir_name,
    step_url,
)

# The one import of checkpoint storage for its callers (the manager, sharded saves, export, the tests): saving is
# here, listing, loading and paths in their own modules.
__all__ = ["FORMAT", "META_FILE", "STATE_FILE", "CheckpointError", "SaveHooks", "cleanup_partial", "is_checkpoint",
           "is_local", "latest", "list_complete", "list_skipped", "load", "load_first_good", "save", "stage_dir",
           "step_url"]


class SaveHooks(Protocol):
    """What a save calls between writing its payload and committing it (a test holds the save there)."""

    def before_commit(self, step: int, url: str) -> None:
        """Called once per save, after every file but the marker is written."""
        ...


class _HashingWriter:
    """File-like wrapper that sha256-hashes and counts what ``torch.save`` writes through it.

    Large chunks are hashed on a helper thread while the same chunk is being written (hashlib and file writes
    both release the GIL), so hashing costs little on top of the write.
    """

    def __init__(self, f: Any, pool: ThreadPoolExecutor) -> None:
        self._f = f
        self._pool = pool
        self._hash = hashlib.sha256()
        self.nbytes = 0

    def write(self, data: Any) -> int:
        n = data.nbytes if isinstance(data, memoryview) else len(data)
        if n >= (1 << 20):
            fut = self._pool.submit(self._hash.update, data)
            self._f.write(data)
            fut.result()
        else:
            self._hash.update(data)
            self._f.write(data)
        self.nbytes += n
        return n

    def flush(self) -> None:
        self._f.flush()

    def hexdigest(self) -> str:
        return self._hash.hexdigest()


def _meta_bytes(step: int, nbytes: int, digest: str, files: dict[str, int] | None = None) -> bytes:
    meta: dict[str, Any] = {
        "format": FORMAT,
        "step": step,
        "time": time.time(),
        "state_file": STATE_FILE,
        "bytes": nbytes,
        "sha256": digest,
        "torch": torch.__version__,
    }
    if files:  # a sharded checkpoint: every rank's files beside state.pt, with their sizes
        meta["files"] = files
    return (json.dumps(meta, indent=1) + "\n").encode()


def _write_payload(fs: fsspec.AbstractFileSystem, path: str, state: dict, local: bool) -> tuple[int, str]:
    with ThreadPoolExecutor(1, thread_name_prefix="ckpt-hash") as pool:
        if local:
            with open(path, "wb") as f:
                w = _HashingWriter(f, pool)
                torch.save(state, w)
                f.flush()
                os.fsync(f.fileno())
        else:
            with fs.open(path, "wb", block_size=64 << 20) as f:
                w = _HashingWriter(f, pool)
                torch.save(state, w)
    return w.nbytes, w.hexdigest()


def stage_dir(ckpt_root: str, step: int) -> str:
    """Create and return the directory a sharded save writes into: every rank writes its shards there, then
    global rank 0 commits it with ``save(..., staged=...)``.

    Local filesystems: a temporary sibling ``step_<N>.tmp-<hex>``, renamed into place by the commit. Object
    stores: the final ``step_<N>`` URL itself (no rename there), emptied first if it exists, so that neither an
    older checkpoint of that step nor an uncommitted attempt's files (another world size's shards) are counted
    as part of this one; it holds no meta.json until the commit, so it is never listed in the meantime.
    """
    fs, root = fs_of(ckpt_root)
    name = step_dir_name(step)
    if not is_local_fs(fs):
        if fs.exists(f"{root}/{name}"):
            remove_dir(fs, f"{root}/{name}")  # un-commit first (meta.json goes first)
        return join_url(ckpt_root, name)
    os.makedirs(root, exist_ok=True)
    tmp = f"{root}/{name}.tmp-{uuid.uuid4().hex}"
    os.mkdir(tmp)
    return tmp


def _staged_files(tmp: str) -> dict[str, int]:
    """Relative path → size of every file under ``tmp`` but the state and the marker (fsynced on the way)."""
    out = {}
    for dirpath, _, names in os.walk(tmp):
        for n in names:
            full = os.path.join(dirpath, n)
            rel = os.path.relpath(full, tmp)
            if rel in (STATE_FILE, META_FILE):
                continue
            with open(full, "rb") as f:
                os.fsync(f.fileno())
            out[rel] = os.path.getsize(full)
        if dirpath != tmp:
            fsync_dir(dirpath)
    return out


def _remote_files(fs: fsspec.AbstractFileSystem, path: str) -> dict[str, int]:
    """Relative path → size of every object under ``path`` but the state and the marker."""
    fs.invalidate_cache(path)  # other ranks wrote there since this process last listed it
    out = {}
    for full, info in fs.find(path, detail=True).items():
        rel = full[len(path) + 1:]
        if rel not in (STATE_FILE, META_FILE):
            out[rel] = int(info["size"])
    return out


def save(ckpt_root: str, step: int, state: dict, *, keep_last: int,
         protect: frozenset[str] = frozenset(), staged: str | None = None, hooks: SaveHooks | None = None) -> str:
    """Write ``state`` as checkpoint ``<ckpt_root>/step_<step>`` atomically; return its URL.

    The checkpoint becomes visible only once complete. Afterwards retention keeps the newest ``keep_last``
    complete checkpoints (``keep_last <= 0`` keeps all), never deletes a URL in ``protect`` (e.g. the
    checkpoint this run resumed from) nor the one just written (it is known good; a newer one left by an earlier
    attempt may have failed its integrity check), never counts partial ones, and removes partial/temp leftovers
    no newer than the checkpoint just written. Saving a step that already exists replaces it.

    ``staged`` (from :func:`stage_dir`) is the directory other ranks have already written their shards into (a
    temporary one locally, ``step_<N>`` itself on an object store): it is committed together with ``state``, and
    meta.json records every file's size.

    ``hooks``: called once, between the payload and the commit (None: nothing is called).
    """
    fs, root = fs_of(ckpt_root)
    url = join_url(ckpt_root, step_dir_name(step))
    if is_local_fs(fs):
        _save_local(fs, root, step, state, staged, hooks, url)
    else:
        _save_remote(fs, root, step, state, staged, hooks, url)
    apply_retention(fs, root, keep_last, protect | {url})
    return url


def _save_local(fs: fsspec.AbstractFileSystem, root: str, step: int, state: dict, staged: str | None,
                hooks: SaveHooks | None, url: str) -> None:
    """Everything into a temporary sibling (or the staged one), fsynced, the marker last, then renamed into place:
    the final name only ever appears complete."""
    name = step_dir_name(step)
    os.makedirs(root, exist_ok=True)
    tmp = staged or f"{root}/{name}.tmp-{uuid.uuid4().hex}"
    if staged is None:
        os.mkdir(tmp)
    try:
        nbytes, digest = _write_payload(fs, f"{tmp}/{STATE_FILE}", state, local=True)
        files = _staged_files(tmp) if staged else None
        if hooks is not None:
            hooks.before_commit(step, url)
        with open(f"{tmp}/{META_FILE}", "wb") as f:
            f.write(_meta_bytes(step, nbytes, digest, files))
            f.flush()
            os.fsync(f.fileno())
        fsync_dir(tmp)
        old = _rename_into_place(tmp, root, name)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _rename_into_place(tmp: str, root: str, name: str) -> str | None:
    """Rename the committed ``tmp`` to ``root/name``; returns where an older checkpoint of that step was moved
    aside (the caller deletes it), None when there was none."""
    final = f"{root}/{name}"
    old = None
    if os.path.exists(final):
        # rename() cannot replace a non-empty dir: move the old one aside (out of the step_<N>
        # namespace, so it is never listed), rename the new one in, then delete the old one.
        old = f"{root}/{name}.old-{uuid.uuid4().hex}"
        os.replace(final, old)
    os.replace(tmp, final)
    fsync_dir(root)
    return old


def _save_remote(fs: fsspec.AbstractFileSystem, root: str, step: int, state: dict, staged: str | None,
                 hooks: SaveHooks | None, url: str) -> None:
    """Straight into ``step_<N>/`` (an object store has no atomic rename), the marker last: a crash leaves a
    directory without one, never listed and cleaned up later."""
    final = f"{root}/{step_dir_name(step)}"
    if staged is not None and fs_of(staged)[1] != final:
        raise CheckpointError(f"{staged}: a sharded save on an object store is staged in {url} itself")
    if staged is None and fs.exists(final):
        remove_dir(fs, final)  # un-commit first (meta.json goes first), then overwrite
    nbytes, digest = _write_payload(fs, f"{final}/{STATE_FILE}", state, local=False)
    files = _remote_files(fs, final) if staged else None
    if hooks is not None:
        hooks.before_commit(step, url)
    fs.pipe_file(f"{final}/{META_FILE}", _meta_bytes(step, nbytes, digest, files))
