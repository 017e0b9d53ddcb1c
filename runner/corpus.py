"""The text corpus: where it lives, what format it is in, and how many samples it yields.

Driver side and worker side both use this module: the driver to plan (sample counts, steps per epoch)
before any process starts, the workers (``tasks/text_data.py``) to cut exactly the same windows. Keeping the
split arithmetic here, in one place, is what makes ``count_samples`` equal ``len(dataset)`` by construction.

No torch or numpy at module level: the driver must start fast. fsspec is light enough.
"""

from __future__ import annotations

import hashlib
import os
import sys
import sysconfig
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fsspec

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


def count_samples(path: str | None, fmt: str, context: int, val_fraction: float) -> tuple[int, int]:
    """Return (train, val) sample counts of a token file from its size alone (no read of its contents).

    ``path`` is any fsspec URL; ``None`` means the default corpus. The counts equal ``len()`` of the datasets
    that ``tasks.text_data.make_datasets`` builds from the same arguments (a val of 0 is its ``None``).
    """
    if path is None:
        path = default_corpus_path()
    fmt = resolve_format(path, fmt)
    fs, fs_path = fsspec.core.url_to_fs(path)
    n_tokens = fs.size(fs_path) // ITEMSIZE[fmt]
    n_train, n_val = split_tokens(n_tokens, val_fraction)
    return num_windows(n_train, context), num_windows(n_val, context)


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
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out:
            written = 0
            for src in _stdlib_sources(stdlib):
                chunk = f"# file: {src.relative_to(stdlib).as_posix()}\n".encode() + src.read_bytes()
                if not chunk.endswith(b"\n"):
                    chunk += b"\n"
                if written + len(chunk) > max_bytes:
                    break
                out.write(chunk)
                written += len(chunk)
            if written == 0:
                raise RuntimeError(f"no stdlib sources fit in {max_bytes} bytes (stdlib: {stdlib})")
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; the cache is read by whoever runs this Python
        os.replace(tmp, target)
    except BaseException:
        # Never leave a stray temp file behind, whatever went wrong.
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return str(target)


@dataclass(frozen=True)
class VocabNeed:
    """The smallest vocabulary a token stream needs, and why (for a refusal's sentence)."""

    size: int
    why: str


def vocab_needed(data: Mapping[str, Any]) -> VocabNeed | None:
    """The vocabulary ``data`` (the ``data`` config group) needs, when it can be known without training.

    ``data.vocab`` when set; 256 for byte-level text; for a uint16 token file, the ``vocab_size`` in the
    ``meta.json`` beside it (written by ``ddp-tokenize``). None when nothing says.
    """
    if data.get("vocab") is not None:
        return VocabNeed(int(data["vocab"]), f"data.vocab={data['vocab']}")
    path = data.get("path") or "corpus.txt"  # null path = the default corpus, which is raw text
    fmt = resolve_format(path, data.get("format", "auto"))
    if FORMAT_VOCAB[fmt] is not None:
        return VocabNeed(FORMAT_VOCAB[fmt], "byte-level text")
    meta = token_meta(path)
    if meta is not None and isinstance(meta.get("vocab_size"), int):
        return VocabNeed(meta["vocab_size"], f"the token file's meta.json (vocab_size {meta['vocab_size']})")
    return None


def token_meta(path: str) -> dict[str, Any] | None:
    """The ``meta.json`` beside a token file, if there is one."""
    import json

    fs, fs_path = fsspec.core.url_to_fs(path)
    meta_path = fs_path.rsplit("/", 1)[0] + "/meta.json" if "/" in fs_path else "meta.json"
    try:
        with fs.open(meta_path, "r") as f:
            return json.load(f)
    except (FileNotFoundError, json.JSONDecodeError, OSError):
        return None
