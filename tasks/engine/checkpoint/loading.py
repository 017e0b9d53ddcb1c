"""Loading a checkpoint: its marker, sizes and sha256 checked against its files, then ``torch.load`` with the
weights-only allowlist (a pickle that could run code is refused, never run)."""

from __future__ import annotations

import hashlib
import io
import pickle
from typing import Any

import fsspec
import torch

from ddp_runner.contract import checkpoints as rules
from ddp_runner.tasks.engine.checkpoint.listing import read_meta
from ddp_runner.tasks.engine.checkpoint.paths import META_FILE, STATE_FILE, CheckpointError, is_local_fs, split_ckpt_url

_CHUNK = 16 << 20


def _sha256_file(fs: fsspec.AbstractFileSystem, path: str) -> str:
    h = hashlib.sha256()
    with fs.open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _size_or_none(fs: fsspec.AbstractFileSystem, path: str) -> int | None:
    try:
        return fs.size(path)
    except FileNotFoundError:
        return None


def load(url: str, map_location: Any = "cpu", *, verify: bool = True) -> dict:
    """Load a complete checkpoint (dir URL or its state.pt URL) with ``torch.load(weights_only=True)``.

    Raises ``CheckpointError`` when the checkpoint is missing or incomplete (no valid meta.json), when the
    payload's size or sha256 (``verify``) differ from meta.json, or when the pickle would need anything
    outside torch's weights-only allowlist (i.e. could run code): such a file is refused without being run.
    """
    fs, path = split_ckpt_url(url)
    meta = read_meta(fs, path)
    if meta is None:
        raise CheckpointError(f"{url}: not a complete checkpoint (no valid {META_FILE} in {path})")
    state_path = f"{path}/{STATE_FILE}"
    if problem := rules.size_problem(url, meta, _size_or_none(fs, state_path)):
        raise CheckpointError(problem)
    if is_local_fs(fs):
        source: Any = state_path
        digest = _sha256_file(fs, state_path) if verify else meta["sha256"]
    else:
        data = fs.cat_file(state_path)  # one download: hash it and unpickle it from memory
        digest = hashlib.sha256(data).hexdigest() if verify else meta["sha256"]
        source = io.BytesIO(data)
    if problem := rules.digest_problem(url, meta["sha256"], digest):
        raise CheckpointError(problem)
    for rel, want in rules.listed_files(meta).items():  # a sharded checkpoint's other files
        fs.invalidate_cache(f"{path}/{rel}")  # its size, not a cached listing's
        if problem := rules.file_size_problem(url, rel, want, _size_or_none(fs, f"{path}/{rel}")):
            raise CheckpointError(problem)
    try:
        return torch.load(source, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(
            f"refused to load {state_path}: its pickle references objects outside torch's weights-only "
            f"allowlist, so unpickling it could run arbitrary code; refused for safety and nothing in it was "
            f"executed ({first})"
        ) from None
    except (RuntimeError, EOFError, ValueError) as e:
        raise CheckpointError(f"{url}: {STATE_FILE} could not be read: {e}") from e


def load_first_good(urls: list[str], map_location: Any = "cpu") -> tuple[dict, str, list[tuple[str, str]]]:
    """Load the first of ``urls`` (newest first) that passes its integrity check and loads.

    Returns ``(state, url, skipped)`` where ``skipped`` lists ``(url, reason)`` for each one passed over (size or
    sha256 differ from meta.json, unreadable, unsafe). Raises ``CheckpointError`` naming every reason when none
    loads. Used by ``resume=auto`` and ``resume=<run dir>``; a checkpoint named explicitly is loaded with
    :func:`load` alone, so that its failure is the answer.
    """
    skipped: list[tuple[str, str]] = []
    for url in urls:
        try:
            return load(url, map_location), url, skipped
        except CheckpointError as e:
            skipped.append((url, str(e)))
    raise CheckpointError("no checkpoint passed its integrity check: " + "; ".join(r for _, r in skipped))
