"""Which checkpoints a root holds: the complete ones (a valid commit marker, the contract's rule), the leftovers of
saves that never committed, and what a reader passes over; and their removal (retention, cleanup), marker first."""

from __future__ import annotations

import re
import shutil

import fsspec

from ddp_runner.contract import checkpoints as rules
from ddp_runner.tasks.engine.checkpoint.paths import META_FILE, fs_of, is_local_fs, join_url, split_ckpt_url

_LEFTOVER_RE = re.compile(r"^step_(\d+)\.(?:tmp|old)-[0-9a-f]+$")


def read_meta(fs: fsspec.AbstractFileSystem, dir_path: str, step: int | None = None) -> dict | None:
    """The parsed, validated meta.json of a checkpoint dir, or None when it is absent or invalid."""
    text = marker_text(fs, dir_path)
    return None if text is None else rules.parse_marker(text, step)


def marker_text(fs: fsspec.AbstractFileSystem, dir_path: str) -> bytes | None:
    """The text of a checkpoint dir's meta.json, None when it has none (or ``dir_path`` is a file, not a dir)."""
    # s3fs answers a file's size (which cat_file asks first) from a cached listing of its directory, which may
    # predate the commit (another process, or this one's listing of a sharded save's files).
    fs.invalidate_cache(dir_path)
    try:
        return fs.cat_file(f"{dir_path}/{META_FILE}")
    except (FileNotFoundError, NotADirectoryError):  # a stray file named step_<N> is no checkpoint
        return None


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
            marker = marker_text(fs, f"{root}/{name}") if is_dir else None
            why = rules.link_problem(f"{root}/{name}") if entry.get("islink") else None  # only local entries
            why = why or rules.entry_problem(name, is_dir, marker is not None)
            if why is None and marker is not None:
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
    fs, root = fs_of(ckpt_root)
    complete, _, _ = _scan(fs, root)
    return [(step, join_url(ckpt_root, name)) for step, name in complete]


def list_skipped(ckpt_root: str) -> list[tuple[str, str]]:
    """Every ``step_<N>`` entry under ``ckpt_root`` that is not a complete checkpoint, as ``(name, why)``: what a
    reader passes over, and says so (``rules.skipped_note``)."""
    fs, root = fs_of(ckpt_root)
    return _scan(fs, root)[2]


def latest(ckpt_root: str) -> str | None:
    """URL of the newest complete checkpoint under ``ckpt_root``, or None when there is none."""
    complete = list_complete(ckpt_root)
    return complete[-1][1] if complete else None


def is_checkpoint(url: str) -> bool:
    """True when ``url`` (a checkpoint dir or its state.pt) is a complete checkpoint (valid meta.json)."""
    fs, path = split_ckpt_url(url)
    return read_meta(fs, path, rules.step_of(path.rsplit("/", 1)[-1])) is not None


def remove_dir(fs: fsspec.AbstractFileSystem, path: str) -> None:
    """Delete a checkpoint directory, its commit marker first."""
    # Remove the commit marker first, so a crash half-way leaves a partial (never listed), not a broken
    # checkpoint that still looks complete.
    try:
        fs.rm_file(f"{path}/{META_FILE}")
    except FileNotFoundError:
        pass
    if is_local_fs(fs):
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            fs.rm(path, recursive=True)
        except FileNotFoundError:
            pass


def _norm_urls(urls: frozenset[str] | set[str]) -> set[str]:
    out = set()
    for u in urls:
        _, p = split_ckpt_url(u)
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
            remove_dir(fs, path)
            removed.append(name)
    return removed


def cleanup_partial(ckpt_root: str) -> list[str]:
    """Remove partial/temporary leftovers no newer than the newest complete checkpoint; returns their names.

    Only call it while no save into ``ckpt_root`` is in flight (the engine's rank 0 is the only writer).
    """
    fs, root = fs_of(ckpt_root)
    return _cleanup(fs, root)


def apply_retention(fs: fsspec.AbstractFileSystem, root: str, keep_last: int,
                    protect: frozenset[str]) -> None:
    """Keep the newest ``keep_last`` complete checkpoints (all when <= 0) but never one in ``protect``, then clean up
    the leftovers."""
    complete, _, _ = _scan(fs, root)
    protected = _norm_urls(protect)
    if keep_last > 0 and len(complete) > keep_last:
        for _, name in complete[:-keep_last]:
            path = f"{root}/{name}"
            if path not in protected:
                remove_dir(fs, path)
    _cleanup(fs, root, protect)
