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
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import re
import shutil
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

import fsspec
import torch
from fsspec.implementations.local import LocalFileSystem

from ddp_runner.contract import checkpoints as rules

STATE_FILE = rules.STATE_FILE
META_FILE = rules.MARKER_FILE
FORMAT = rules.FORMAT

_LEFTOVER_RE = re.compile(r"^step_(\d+)\.(?:tmp|old)-[0-9a-f]+$")
_CHUNK = 16 << 20


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete, corrupt, unsafe to unpickle, or could not be written."""


class SaveHooks(Protocol):
    """What a save calls between writing its payload and committing it (a test holds the save there)."""

    def before_commit(self, step: int, url: str) -> None:
        """Called once per save, after every file but the marker is written."""
        ...


# --------------------------------------------------------------------------------------------- helpers


def _fs(url: str) -> tuple[fsspec.AbstractFileSystem, str]:
    fs, path = fsspec.core.url_to_fs(url)
    return fs, path.rstrip("/") or path


def _is_local(fs: fsspec.AbstractFileSystem) -> bool:
    return isinstance(fs, LocalFileSystem)


def _join_url(root_url: str, name: str) -> str:
    # Keep the caller's spelling of the root (relative path, file://, s3://) in the URLs we return.
    return root_url.rstrip("/") + "/" + name


def step_url(ckpt_root: str, step: int) -> str:
    """URL of checkpoint ``step`` under ``ckpt_root`` (complete or not)."""
    return _join_url(ckpt_root, _step_dir_name(step))


_step_dir_name = rules.step_dir_name


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


def _read_meta(fs: fsspec.AbstractFileSystem, dir_path: str, step: int | None = None) -> dict | None:
    """The parsed, validated meta.json of a checkpoint dir, or None when it is absent or invalid."""
    text = _marker_text(fs, dir_path)
    return None if text is None else rules.parse_marker(text, step)


def _marker_text(fs: fsspec.AbstractFileSystem, dir_path: str) -> bytes | None:
    """The text of a checkpoint dir's meta.json, None when it has none (or ``dir_path`` is a file, not a dir)."""
    # s3fs answers a file's size (which cat_file asks first) from a cached listing of its directory, which may
    # predate the commit (another process, or this one's listing of a sharded save's files).
    fs.invalidate_cache(dir_path)
    try:
        return fs.cat_file(f"{dir_path}/{META_FILE}")
    except (FileNotFoundError, NotADirectoryError):  # a stray file named step_<N> is no checkpoint
        return None


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ------------------------------------------------------------------------------------------- listing


def _scan(fs: fsspec.AbstractFileSystem, root: str
          ) -> tuple[list[tuple[int, str]], list[tuple[int, str]], list[tuple[str, str]]]:
    """(complete, leftovers, skipped): complete and leftovers as (step, entry name) lists, complete sorted by step;
    skipped as (entry name, why) for every ``step_<N>`` that is not a complete checkpoint (the contract's rule).

    A leftover is this module's own: a save's temporary sibling, or a ``step_<N>`` folder without its marker.
    A *file* named ``step_<N>`` is neither complete nor a leftover: skipped, and never deleted (not ours)."""
    fs.invalidate_cache(root)  # object-store listings are cached; another process may have written since
    try:
        entries = fs.ls(root, detail=True)
    except (FileNotFoundError, NotADirectoryError):
        return [], [], []
    complete: list[tuple[int, str]] = []
    leftovers: list[tuple[int, str]] = []
    skipped: list[tuple[str, str]] = []
    for entry in entries:
        name = entry["name"].rstrip("/").rsplit("/", 1)[-1]
        if (step := rules.step_of(name)) is not None:
            is_dir = entry.get("type") == "directory"
            marker = _marker_text(fs, f"{root}/{name}") if is_dir else None
            if (why := rules.entry_problem(name, is_dir, marker is not None)) is None and marker is not None:
                why = rules.marker_problem(name, marker)  # the workers load only what a valid marker commits
            if why is None:
                complete.append((step, name))
                continue
            skipped.append((name, why))
            if is_dir:
                leftovers.append((step, name))  # an object-store save that never committed
        elif m := _LEFTOVER_RE.match(name):
            leftovers.append((int(m.group(1)), name))
    complete.sort()
    skipped.sort(key=lambda s: rules.step_of(s[0]) or 0)
    return complete, leftovers, skipped


def list_complete(ckpt_root: str) -> list[tuple[int, str]]:
    """All complete checkpoints under ``ckpt_root`` as ``(step, url)``, sorted by step (oldest first)."""
    fs, root = _fs(ckpt_root)
    complete, _, _ = _scan(fs, root)
    return [(step, _join_url(ckpt_root, name)) for step, name in complete]


def list_skipped(ckpt_root: str) -> list[tuple[str, str]]:
    """Every ``step_<N>`` entry under ``ckpt_root`` that is not a complete checkpoint, as ``(name, why)``: what a
    reader passes over, and says so (``rules.skipped_note``)."""
    fs, root = _fs(ckpt_root)
    return _scan(fs, root)[2]


def latest(ckpt_root: str) -> str | None:
    """URL of the newest complete checkpoint under ``ckpt_root``, or None when there is none."""
    complete = list_complete(ckpt_root)
    return complete[-1][1] if complete else None


def _split_ckpt_url(url: str) -> tuple[fsspec.AbstractFileSystem, str]:
    """(fs, checkpoint dir path) for a checkpoint dir URL or its state.pt URL."""
    fs, path = _fs(url)
    if path.rsplit("/", 1)[-1] == STATE_FILE:
        path = path.rsplit("/", 1)[0]
    return fs, path


def is_checkpoint(url: str) -> bool:
    """True when ``url`` (a checkpoint dir or its state.pt) is a complete checkpoint (valid meta.json)."""
    fs, path = _split_ckpt_url(url)
    return _read_meta(fs, path, rules.step_of(path.rsplit("/", 1)[-1])) is not None


# ------------------------------------------------------------------------------------------ deletion


def _remove_dir(fs: fsspec.AbstractFileSystem, path: str) -> None:
    # Remove the commit marker first, so a crash half-way leaves a partial (never listed), not a broken
    # checkpoint that still looks complete.
    try:
        fs.rm_file(f"{path}/{META_FILE}")
    except FileNotFoundError:
        pass
    if _is_local(fs):
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            fs.rm(path, recursive=True)
        except FileNotFoundError:
            pass


def _norm_urls(urls: frozenset[str] | set[str]) -> set[str]:
    out = set()
    for u in urls:
        _, p = _split_ckpt_url(u)
        out.add(p)
    return out


def _cleanup(fs: fsspec.AbstractFileSystem, root: str, protect: frozenset[str] = frozenset()) -> list[str]:
    complete, leftovers, _ = _scan(fs, root)
    if not complete:
        return []  # nothing committed yet: a leftover could still be the only trace of progress; keep it
    newest = complete[-1][0]
    protected = _norm_urls(protect)
    removed = []
    for step, name in leftovers:
        path = f"{root}/{name}"
        # Only leftovers at or before the newest complete step are certainly dead (one writer at a time).
        if step <= newest and path not in protected:
            _remove_dir(fs, path)
            removed.append(name)
    return removed


def cleanup_partial(ckpt_root: str) -> list[str]:
    """Remove partial/temporary leftovers no newer than the newest complete checkpoint; returns their names.

    Only call it while no save into ``ckpt_root`` is in flight (the engine's rank 0 is the only writer).
    """
    fs, root = _fs(ckpt_root)
    return _cleanup(fs, root)


def _apply_retention(fs: fsspec.AbstractFileSystem, root: str, keep_last: int,
                     protect: frozenset[str]) -> None:
    complete, _, _ = _scan(fs, root)
    protected = _norm_urls(protect)
    if keep_last > 0 and len(complete) > keep_last:
        for _, name in complete[:-keep_last]:
            path = f"{root}/{name}"
            if path not in protected:
                _remove_dir(fs, path)
    _cleanup(fs, root, protect)


# --------------------------------------------------------------------------------------------- save


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


def is_local(url: str) -> bool:
    """Whether ``url`` is on a local (or mounted shared) filesystem, where a save is committed by a rename."""
    return _is_local(_fs(url)[0])


def stage_dir(ckpt_root: str, step: int) -> str:
    """Create and return the directory a sharded save writes into: every rank writes its shards there, then
    global rank 0 commits it with ``save(..., staged=...)``.

    Local filesystems: a temporary sibling ``step_<N>.tmp-<hex>``, renamed into place by the commit. Object
    stores: the final ``step_<N>`` URL itself (no rename there), emptied first if it exists, so that neither an
    older checkpoint of that step nor an uncommitted attempt's files (another world size's shards) are counted
    as part of this one; it holds no meta.json until the commit, so it is never listed in the meantime.
    """
    fs, root = _fs(ckpt_root)
    name = _step_dir_name(step)
    if not _is_local(fs):
        if fs.exists(f"{root}/{name}"):
            _remove_dir(fs, f"{root}/{name}")  # un-commit first (meta.json goes first)
        return _join_url(ckpt_root, name)
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
            _fsync_dir(dirpath)
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
    name = _step_dir_name(step)
    fs, root = _fs(ckpt_root)
    final = f"{root}/{name}"
    url = _join_url(ckpt_root, name)
    if _is_local(fs):
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
            _fsync_dir(tmp)
            old = None
            if os.path.exists(final):
                # rename() cannot replace a non-empty dir: move the old one aside (out of the step_<N>
                # namespace, so it is never listed), rename the new one in, then delete the old one.
                old = f"{root}/{name}.old-{uuid.uuid4().hex}"
                os.replace(final, old)
            os.replace(tmp, final)
            _fsync_dir(root)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    else:
        if staged is not None and _fs(staged)[1] != final:
            raise CheckpointError(f"{staged}: a sharded save on an object store is staged in {url} itself")
        if staged is None and fs.exists(final):
            _remove_dir(fs, final)  # un-commit first (meta.json goes first), then overwrite
        nbytes, digest = _write_payload(fs, f"{final}/{STATE_FILE}", state, local=False)
        files = _remote_files(fs, final) if staged else None
        if hooks is not None:
            hooks.before_commit(step, url)
        fs.pipe_file(f"{final}/{META_FILE}", _meta_bytes(step, nbytes, digest, files))
    _apply_retention(fs, root, keep_last, protect | {url})
    return url


# --------------------------------------------------------------------------------------------- load


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
    fs, path = _split_ckpt_url(url)
    meta = _read_meta(fs, path)
    if meta is None:
        raise CheckpointError(f"{url}: not a complete checkpoint (no valid {META_FILE} in {path})")
    state_path = f"{path}/{STATE_FILE}"
    if problem := rules.size_problem(url, meta, _size_or_none(fs, state_path)):
        raise CheckpointError(problem)
    if _is_local(fs):
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
