"""The corpus format both sides share: token formats, the train/val split, the windows a range yields, and the
default corpus. The driver plans sample counts with it before any process starts, the workers
(``tasks/gpt/data.py``) cut exactly the same windows: keeping the split arithmetic in one place is what makes
``count_samples`` equal ``len(dataset)`` by construction.

Also what a token file needs of a model: its vocabulary, from its own metadata or a scan for the largest id.
Standard library only at import (fsspec and numpy are imported where a file is read).
"""

from __future__ import annotations

import hashlib
import os
import sys
import sysconfig
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddp_runner.contract import layout
from ddp_runner.contract.osutil import atomic_write

# Bytes per token of each on-disk format, and the vocabulary a format implies (None: the format implies none).
ITEMSIZE: dict[str, int] = {"bytes": 1, "uint16": 2}
FORMAT_VOCAB: dict[str, int | None] = {"bytes": 256, "uint16": None}
FORMATS = ("auto", *ITEMSIZE)

# 12 MB of stdlib source: big enough that a tiny model does not memorise it in a few hundred steps, small
# enough to build in well under a second and to sit in every page cache.
DEFAULT_MAX_BYTES = 12_000_000
# Directory names skipped in the stdlib: installed packages (not the stdlib, and they differ per machine) and
# the test suites (deliberately odd encodings and data blobs, not representative code).
_SKIP_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__", "test", "tests", "idle_test"})


def resolve_format(path: str, fmt: str) -> str:
    """Return the concrete token format of ``path``: ``"bytes"`` or ``"uint16"``.

    ``fmt="auto"`` picks ``uint16`` (pre-tokenized, nanoGPT-style ``.bin``) for a ``.bin`` suffix and raw
    bytes (byte-level tokens, vocabulary 256) for anything else.
    """
    if fmt == "auto":
        return "uint16" if str(path).lower().endswith(".bin") else "bytes"
    if fmt not in ITEMSIZE:
        raise ValueError(f"data.format must be one of {', '.join(FORMATS)}; got {fmt!r}")
    return fmt


def split_tokens(n_tokens: int, val_fraction: float) -> tuple[int, int]:
    """Split a stream of ``n_tokens`` into contiguous (train, val) token counts: train first, val last."""
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"data.val_fraction must be in [0, 1); got {val_fraction}")
    n_val = int(n_tokens * val_fraction)
    return n_tokens - n_val, n_val


def num_windows(n_tokens: int, context: int) -> int:
    """Samples in a range of ``n_tokens``: window ``i`` reads tokens ``[i*T, i*T + T]``, both inclusive.

    Consecutive windows share one token (the last target of one is the first input of the next), so every
    token but the first is a target exactly once.
    """
    if context < 1:
        raise ValueError(f"context must be >= 1; got {context}")
    return max(0, (n_tokens - 1) // context)


@dataclass(frozen=True)
class TokenRange:
    """Tokens ``[start, start + n_tokens)`` of the token file at ``url``, in concrete format ``fmt``."""

    url: str
    fmt: str
    start: int
    n_tokens: int


def token_count(url: str, fmt: str) -> int:
    """Whole tokens in the file at ``url`` (a trailing odd byte of a uint16 file is not a token)."""
    import fsspec  # here, not at import: this module stays standard library only

    fs, fs_path = fsspec.core.url_to_fs(url)
    return fs.size(fs_path) // ITEMSIZE[fmt]


def token_ranges(
    path: str | None, fmt: str, val_fraction: float, val_path: str | None = None
) -> tuple[TokenRange, TokenRange]:
    """The (train, val) token ranges of the ``data: text`` config, from file sizes alone.

    With ``val_path`` the whole of ``path`` trains and the whole of ``val_path`` validates (each file's format
    resolved by the same rules; ``val_fraction`` is then unused). Without it, val is the ``val_fraction`` tail
    of ``path``. ``path=None`` means the default corpus. A val range may hold 0 tokens.
    """
    if path is None:
        path = default_corpus_path()
    train_fmt = resolve_format(path, fmt)
    n_tokens = token_count(path, train_fmt)
    if val_path:
        val_fmt = resolve_format(val_path, fmt)
        return (TokenRange(path, train_fmt, 0, n_tokens),
                TokenRange(val_path, val_fmt, 0, token_count(val_path, val_fmt)))
    n_train, n_val = split_tokens(n_tokens, val_fraction)
    return TokenRange(path, train_fmt, 0, n_train), TokenRange(path, train_fmt, n_train, n_val)


def count_samples(
    path: str | None, fmt: str, context: int, val_fraction: float, val_path: str | None = None
) -> tuple[int, int]:
    """Return (train, val) sample counts of the token files from their sizes alone (no read of contents).

    ``path`` and ``val_path`` are fsspec URLs; ``path=None`` means the default corpus, ``val_path=None`` the
    ``val_fraction`` tail of ``path``. The counts equal ``len()`` of the datasets that
    ``ddp_runner.tasks.gpt.data.make_datasets`` builds from the same arguments (a val of 0 is its ``None``).
    """
    train, val = token_ranges(path, fmt, val_fraction, val_path)
    return num_windows(train.n_tokens, context), num_windows(val.n_tokens, context)


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "ddp-runner" / "corpus"


def _stdlib_sources(stdlib: Path) -> list[Path]:
    """The stdlib's .py files in a deterministic order (sorted relative paths, skipped dirs pruned)."""
    files = []
    for root, dirs, names in os.walk(stdlib):
        dirs[:] = [d for d in dirs if d not in _SKIP_DIRS]
        files.extend(Path(root) / n for n in names if n.endswith(".py"))
    return sorted(files, key=lambda p: p.relative_to(stdlib).as_posix())


def default_corpus_path(max_bytes: int = DEFAULT_MAX_BYTES) -> str:
    """Return the local path of the default text corpus, building it on first use.

    The corpus is this Python's own standard library source: every ``.py`` file under
    ``sysconfig.get_paths()["stdlib"]`` (installed packages and test suites excluded), in sorted order, each
    preceded by a ``# file: <relative path>`` line, until ``max_bytes`` would be exceeded. Nothing is
    downloaded, and the same Python always yields the same bytes.

    Built once and cached under ``${XDG_CACHE_HOME:-~/.cache}/ddp-runner/corpus/``, keyed by Python version,
    stdlib location and size cap. The file is written to a temporary name and renamed into place, so ranks or
    drivers building it concurrently never see a partial file (the last rename wins; all write the same
    bytes).
    """
    if max_bytes < 1:
        raise ValueError(f"max_bytes must be >= 1; got {max_bytes}")
    stdlib = Path(sysconfig.get_paths()["stdlib"]).resolve()
    # The path hash separates two installs of one version (e.g. pyenv vs system), whose sources may differ.
    digest = hashlib.sha256(f"{stdlib}\0{max_bytes}".encode()).hexdigest()[:10]
    version = "{}.{}.{}".format(*sys.version_info[:3])
    target = _cache_dir() / f"stdlib-py{version}-{digest}.txt"
    if target.is_file():
        return str(target)

    target.parent.mkdir(parents=True, exist_ok=True)
    chunks, written = [], 0
    for src in _stdlib_sources(stdlib):
        chunk = f"# file: {src.relative_to(stdlib).as_posix()}\n".encode() + src.read_bytes()
        if not chunk.endswith(b"\n"):
            chunk += b"\n"
        if written + len(chunk) > max_bytes:
            break
        chunks.append(chunk)
        written += len(chunk)
    if written == 0:
        raise RuntimeError(f"no stdlib sources fit in {max_bytes} bytes (stdlib: {stdlib})")
    atomic_write(target, b"".join(chunks), mode=0o644)  # read by whoever runs this Python
    return str(target)


@dataclass(frozen=True)
class VocabNeed:
    """The smallest vocabulary a token stream needs, and why (for a refusal's sentence)."""

    size: int
    why: str


def vocab_needed(data: Mapping[str, Any]) -> VocabNeed | None:
    """The vocabulary ``data`` (the ``data`` config group) needs, when it can be known before launch.

    ``data.vocab`` when set. Otherwise the largest need over ``data.path`` and ``data.val_path``: 256 for
    byte-level text; for a uint16 token file, the ``vocab_size`` of the ``meta.json`` beside it (written by
    ``ddp-tokenize``) when that meta.json describes this file, else its largest token id + 1, found by scanning
    (local files always; remote ones up to ``SCAN_REMOTE_MAX_BYTES``). None when nothing says.
    """
    if data.get("vocab") is not None:
        return VocabNeed(int(data["vocab"]), f"data.vocab={data['vocab']}")
    fmt = data.get("format", "auto")
    needs = []
    # A null path is the default corpus, which is raw text: no need to build it to know that.
    for key, url in (("data.path", data.get("path") or "corpus.txt"), ("data.val_path", data.get("val_path"))):
        if url:
            need = file_vocab_need(key, url, fmt)
            if need is not None:
                needs.append(need)
    return max(needs, key=lambda n: n.size, default=None)


def file_vocab_need(key: str, url: str, fmt: str) -> VocabNeed | None:
    """The vocabulary one token file (config key ``key``) needs; see :func:`vocab_needed`."""
    fmt = resolve_format(url, fmt)
    implied = FORMAT_VOCAB[fmt]
    if implied is not None:
        return VocabNeed(implied, f"{key} is byte-level text, which")
    meta = token_meta(url)
    if meta is not None and isinstance(meta.get("vocab_size"), int) and meta_describes(meta, url, fmt):
        return VocabNeed(meta["vocab_size"], f"{key}'s meta.json (vocab_size {meta['vocab_size']})")
    try:
        top = max_token_id(url)
    except FileNotFoundError:
        return None  # prepare() refuses a missing file with its own message
    if top is None:
        return None
    return VocabNeed(top + 1, f"{key} (largest token id {top}, found by scanning the file)")


def token_meta(path: str) -> dict[str, Any] | None:
    """The ``meta.json`` beside a token file, if there is one."""
    import json

    import fsspec

    fs, fs_path = fsspec.core.url_to_fs(path)
    meta_path = (fs_path.rsplit("/", 1)[0] + "/" if "/" in fs_path else "") + layout.TOKENS_META
    try:
        with fs.open(meta_path, "r") as f:
            meta = json.load(f)
    except (FileNotFoundError, json.JSONDecodeError, UnicodeDecodeError, OSError):
        return None
    return meta if isinstance(meta, dict) else None


def meta_describes(meta: Mapping[str, Any], url: str, fmt: str) -> bool:
    """Whether ``meta`` (a meta.json) is about the token file at ``url``.

    ddp-tokenize's meta.json lists its files and their token counts: a file it does not list, or whose size no
    longer matches, is not described by it (another file dropped in the folder, or a stale meta.json). A
    meta.json without that list (another tool's) is trusted as before.
    """
    files, tokens = meta.get("files"), meta.get("tokens")
    if not isinstance(files, Mapping) or not isinstance(tokens, Mapping):
        return True
    name = url.rstrip("/").rsplit("/", 1)[-1]
    for split, file_name in files.items():
        if file_name == name:
            try:
                return tokens.get(split) == token_count(url, fmt)
            except FileNotFoundError:
                return False
    return False


# A remote file is scanned for its largest id only up to this size (a full read per launch); beyond, None.
SCAN_REMOTE_MAX_BYTES = 256 * 2**20
_SCAN_CHUNK_TOKENS = 16 * 2**20  # 32 MB of uint16 per numpy max(): bounded memory, near memory bandwidth


def max_token_id(url: str, remote_max_bytes: int | None = None) -> int | None:
    """The largest token id in the uint16 file at ``url``; None when it holds no token or is too big to scan.

    Local files are memory-mapped and scanned in chunks (a GB takes well under a second from the page cache);
    other URLs are read in chunks when at most ``remote_max_bytes`` (default ``SCAN_REMOTE_MAX_BYTES``). A
    trailing odd byte is ignored.
    """
    import fsspec
    import numpy as np
    from fsspec.implementations.local import LocalFileSystem

    fs, fs_path = fsspec.core.url_to_fs(url)
    size = fs.size(fs_path)
    n = size // 2
    if n == 0:
        return None
    top = 0
    if isinstance(fs, LocalFileSystem):
        mm = np.memmap(fs_path, dtype="<u2", mode="r", shape=(n,))
        for i in range(0, n, _SCAN_CHUNK_TOKENS):
            top = max(top, int(mm[i : i + _SCAN_CHUNK_TOKENS].max()))
        del mm
        return top
    if size > (SCAN_REMOTE_MAX_BYTES if remote_max_bytes is None else remote_max_bytes):
        return None
    with fs.open(fs_path, "rb") as f:
        left = n * 2
        while left > 0:
            raw = f.read(min(left, _SCAN_CHUNK_TOKENS * 2))  # even-sized requests keep tokens whole
            if not raw:
                break
            raw = raw[: len(raw) // 2 * 2]
            left -= len(raw)
            if raw:
                top = max(top, int(np.frombuffer(raw, dtype="<u2").max()))
    return top
