"""ddp-tokenize's input: the text files of a file or folder (any fsspec URL), refused when binary, read in pieces
cut at line ends, with bytes that are not UTF-8 replaced and counted."""

from __future__ import annotations

import codecs
import fnmatch
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fsspec

from ddp_runner.data.tokenize.usage import UsageError

# Text handed to the tokenizer per piece (cut at a line end).
CHUNK_BYTES = 1 << 20


@dataclass(frozen=True)
class Source:
    """One input document: a file, by its path on ``fs`` and its path relative to the input."""

    path: str
    rel: str
    size: int


def default_out(input_path: str) -> str:
    """``./<input name without suffix>-tokens``, in the current folder wherever the input lives (a remote
    input is not written beside). ``input_path`` is the input's path on its filesystem (absolute if local)."""
    name = input_path.rstrip("/").rsplit("/", 1)[-1]
    stem = name.lstrip(".").split(".")[0]
    return str(Path.cwd() / f"{stem or 'input'}-tokens")


def input_fs(url: str) -> tuple[Any, str]:
    """The input's filesystem and path (UsageError when it cannot be opened or does not exist)."""
    try:
        fs, root = fsspec.core.url_to_fs(url)
    except (ImportError, ValueError) as exc:
        raise UsageError("input", url, f"cannot be opened ({exc})",
                         "pass a local path or an fsspec URL whose backend is installed") from exc
    if not fs.exists(root):
        raise UsageError("input", url, "not found", "pass an existing text file or folder")
    return fs, root


def find_sources(fs: Any, root: str, url: str, globs: Sequence[str], exclude: str | None = None) -> list[Source]:
    """The input's text files, sorted by relative path (the order of the documents and of the hash).

    A file is taken whatever its name; a folder is searched recursively for names matching ``globs``, skipping
    hidden files and folders (``.git``, ``.venv``...) and anything under ``exclude`` (the output folder).
    """
    info = fs.info(root)
    if info.get("type") != "directory":
        if not info.get("size"):
            raise UsageError("input", url, "is an empty file", "pass a file or folder that holds text")
        return [Source(root, root.rsplit("/", 1)[-1], int(info["size"]))]
    base = root.rstrip("/") + "/"
    found = []
    for path, detail in fs.find(root, detail=True).items():
        if detail.get("type") != "file" or (exclude and (path + "/").startswith(exclude)):
            continue
        rel = path[len(base):] if path.startswith(base) else path.rsplit("/", 1)[-1]
        parts = rel.split("/")
        if any(p.startswith(".") for p in parts):
            continue
        if any(fnmatch.fnmatchcase(parts[-1], g) for g in globs):
            found.append(Source(path, rel, int(detail.get("size") or 0)))
    pattern = " ".join(globs)
    if not found:
        raise UsageError("input", url, f"is a folder with no text files matching {pattern}",
                         "pass --glob with your files' pattern (e.g. --glob '*.jsonl', repeatable), or a single file")
    found.sort(key=lambda s: s.rel)
    if not any(s.size for s in found):
        raise UsageError("input", url, f"its {len(found)} file(s) matching {pattern} are all empty",
                         "pass a folder or file that holds text")
    return found


# Bytes that are not UTF-8: replaced by U+FFFD as the "replace" handler does, and counted (one CLI, one thread).
_COUNTING = "ddp-tokenize-count"
_REPLACED = [0]


def _count_and_replace(exc: UnicodeError) -> tuple[str, int]:
    assert isinstance(exc, UnicodeDecodeError)
    _REPLACED[0] += exc.end - exc.start
    return "\ufffd", exc.end


def replaced_bytes() -> int:
    """How many bytes that were not UTF-8 :func:`read_text` has replaced so far (this process)."""
    return _REPLACED[0]


codecs.register_error(_COUNTING, _count_and_replace)
# What a binary file starts with (executables, archives, images, PDFs, compiled Python, numpy, torch).
_MAGIC = {b"\x7fELF": "an ELF executable", b"MZ": "a Windows executable", b"PK\x03\x04": "a zip archive",
          b"\x1f\x8b": "a gzip archive", b"%PDF": "a PDF", b"\x89PNG": "a PNG image", b"\xff\xd8\xff": "a JPEG image",
          b"\x93NUMPY": "a numpy array", b"\xcf\xfa\xed\xfe": "a Mach-O executable", b"BZh": "a bzip2 archive",
          b"\xfd7zXZ": "an xz archive", b"(\xb5/\xfd": "a zstd archive"}


def binary_kind(head: bytes) -> str | None:
    """What a file that begins with ``head`` is when it is not text (None: it may be text): a known magic
    number, or NUL bytes, which no text file holds."""
    for magic, kind in _MAGIC.items():
        if head.startswith(magic):
            return kind
    if b"\x00" in head:
        return "binary data (it holds NUL bytes)"
    return None


def check_text(fs: Any, sources: list[Source], url: str) -> None:
    """Refuse (UsageError) input whose files are binary, naming the first such file."""
    for s in sources:
        with fs.open(s.path, "rb") as f:
            kind = binary_kind(f.read(8192))
        if kind:
            where = url if len(sources) == 1 else f"{url} ({s.rel})"
            raise UsageError("input", where, f"is {kind}, not text",
                             "pass text files (a folder is searched for --glob patterns: narrow them, e.g. --glob"
                             " '*.txt')")


def read_text(fs: Any, path: str, chunk: int = CHUNK_BYTES, hasher: Any = None,
              progress: Any = None) -> Iterator[str]:
    """The text of a file in pieces of about ``chunk`` bytes, each cut after a line end.

    Cutting at line ends keeps almost every token whole across pieces. Bytes that are not UTF-8 become U+FFFD
    (a stray Latin-1 byte should not stop a corpus); a UTF-8 byte-order mark is dropped. ``hasher`` sees the raw
    bytes, ``progress`` their count.
    """
    decoder = codecs.getincrementaldecoder("utf-8-sig")(errors=_COUNTING)
    pending = ""
    with fs.open(path, "rb") as f:
        while raw := f.read(chunk):
            if hasher is not None:
                hasher.update(raw)
            if progress is not None:
                progress.update(len(raw))
            text = pending + decoder.decode(raw)
            cut = text.rfind("\n") + 1
            if cut == 0 and len(text) < 8 * chunk:  # no line end yet: wait for one, within reason
                pending = text
                continue
            cut = cut or len(text)
            pending = text[cut:]
            yield text[:cut]
    tail = pending + decoder.decode(b"", final=True)
    if tail:
        yield tail
