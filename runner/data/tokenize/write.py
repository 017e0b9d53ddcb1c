"""ddp-tokenize's output: the train/val split at a document boundary, and the files put in place with meta.json
last (a meta.json always describes the files beside it)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from ddp_runner.contract import layout


def choose_split(n_tokens: int, doc_ends: list[int], val_fraction: float) -> tuple[int, dict[str, Any]]:
    """Training tokens (a prefix; val is the rest) and how the cut was chosen.

    The cut goes at the document end nearest to holding out ``val_fraction`` of the tokens when that keeps
    the held-out share within half to one and a half times the target; else at the exact tail (one large
    document, or a few very unequal ones).
    """
    n_val = int(n_tokens * val_fraction)
    if n_val == 0:
        return n_tokens, {"method": "none", "val_documents": 0}
    target = n_tokens - n_val
    inner = [e for e in doc_ends if 0 < e < n_tokens]
    if inner:
        cut = min(inner, key=lambda e: (abs(e - target), e))
        if 0.5 * n_val <= n_tokens - cut <= 1.5 * n_val:
            return cut, {"method": "documents", "val_documents": sum(1 for e in doc_ends if e > cut)}
    return target, {"method": "tail", "val_documents": None}


def split_file(tokens: Path, val: Path, n_train: int, n_val: int) -> None:
    """Move the last ``n_val`` tokens of ``tokens`` to ``val`` and truncate: no copy of the training part."""
    if n_val == 0:
        return
    with open(tokens, "rb+") as src, open(val, "wb") as dst:
        src.seek(n_train * 2)
        shutil.copyfileobj(src, dst, 16 << 20)
        src.truncate(n_train * 2)


def publish(fs: Any, root: str, local: bool, files: dict[str, Path | None]) -> None:
    """Put the finished files in place: meta.json removed first and written last, so that a meta.json always
    describes the files beside it. Local: atomic renames. Remote: uploads (each object appears whole)."""
    fs.makedirs(root, exist_ok=True)
    meta = files.pop(layout.TOKENS_META)
    target = f"{root.rstrip('/')}/"
    if fs.exists(target + layout.TOKENS_META):
        fs.rm(target + layout.TOKENS_META)
    for name, tmp in [*files.items(), (layout.TOKENS_META, meta)]:
        if tmp is None:  # not produced this time: a stale one from an earlier run must not linger
            if fs.exists(target + name):
                fs.rm(target + name)
        elif local:
            os.replace(tmp, target + name)
        else:
            fs.put_file(str(tmp), target + name)


def is_local(fs: Any) -> bool:
    """Whether ``fs`` is the local disk: the output is then built beside its place and renamed, not uploaded."""
    from fsspec.implementations.local import LocalFileSystem

    return isinstance(fs, LocalFileSystem)


def display_url(url: str, fs: Any, root: str) -> str:
    """The output as a user would pass it to ddp-run: absolute for local folders, the URL otherwise."""
    return str(Path(root).resolve()) if is_local(fs) else url.rstrip("/")

