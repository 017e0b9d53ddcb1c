"""``ddp-tokenize``: turn your own text into the uint16 token files that ``task=gpt`` trains on.

Input is any fsspec URL: one text file, or a folder searched recursively for text files (``--glob``). Each
file is one document. Output is a folder (any fsspec URL) holding ``train.bin`` and ``val.bin`` (little-endian
uint16 token ids, documents separated by ``<|endoftext|>`` when the tokenizer has it), ``tokenizer.json`` and
``meta.json`` (vocabulary size, token counts, the source and its sha256, the tokenizer). ``ddp-run`` reads
meta.json before launch to refuse a model whose vocabulary is too small for the ids.

The default tokenizer is a byte-level BPE trained on the text itself (offline, any language or code);
``--tokenizer gpt2`` uses GPT-2's (downloaded from the Hugging Face Hub), ``--tokenizer <tokenizer.json>``
any saved one. Text is read in chunks, so inputs larger than memory are fine (the token ids go to a temporary
file, then are split); with a trained tokenizer, ``--train-bytes`` bounds the text it learns from.
"""

from __future__ import annotations

import argparse
import codecs
import fnmatch
import hashlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import fsspec

from ddp_runner.contract import layout
from ddp_runner.contract.errors import PlanError

PROG = "ddp-tokenize"
DEFAULT_GLOBS = ("*.txt", "*.md", "*.rst", "*.py")
DEFAULT_VOCAB = 8192
# uint16 holds ids 0..65535; 65535 itself stays free (a sentinel some tools use), hence the bound.
MAX_VOCAB = 65535
MIN_VOCAB = 257  # the 256 byte tokens a byte-level BPE starts from, plus <|endoftext|>
EOT = "<|endoftext|>"
EXIT_USAGE = 2
# Text handed to the tokenizer per piece (cut at a line end), and per encode call (pieces are encoded in
# parallel by the tokenizers library within a call).
CHUNK_BYTES = 1 << 20
BATCH_BYTES = 16 << 20
DEFAULT_TRAIN_BYTES = 1 << 30  # a BPE learns its merges well from a GB; more costs memory and minutes


class UsageError(PlanError):
    """A refusal of an option (the runner's refusal: key, value, problem, fix), worded for a shell."""

    def __str__(self) -> str:
        return f"{self.key}={self.value}: {self.problem}. Fix: {self.fix}"


@dataclass(frozen=True)
class Source:
    """One input document: a file, by its path on ``fs`` and its path relative to the input."""

    path: str
    rel: str
    size: int


@dataclass
class Encoded:
    """What the encoding pass produced: ids in ``tokens_file``, documents' end offsets, the input's sha256."""

    tokens_file: str
    n_tokens: int
    doc_ends: list[int] = field(default_factory=list)
    sha256: str = ""
    undecodable: dict[str, int] = field(default_factory=dict)  # bytes that were not UTF-8, by source file


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``ddp-tokenize``."""
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Tokenize your own text into uint16 token files (train.bin, val.bin, tokenizer.json, "
                    "meta.json) for ddp-run task=gpt.",
        epilog="Examples:\n"
               "  ddp-tokenize notes/                      # BPE trained on notes/**/*.{txt,md,rst,py}\n"
               "  ddp-tokenize book.txt --out book-tok --vocab-size 4096\n"
               "  ddp-tokenize s3://bucket/corpus/ --glob '*.jsonl' --tokenizer gpt2 --out s3://bucket/tok/\n"
               "Then train with the ddp-run line printed at the end, e.g.\n"
               "  ddp-run task=gpt data.path=book-tok/train.bin data.val_path=book-tok/val.bin "
               "task.model.vocab=4096",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("input", help="text file or folder, any fsspec URL (local path, s3://, gs://, memory://...)")
    p.add_argument("--out", metavar="URL",
                   help="output folder, any fsspec URL (default: ./<input name>-tokens in the current folder)")
    p.add_argument("--glob", action="append", metavar="PATTERN",
                   help=f"file-name pattern of the text files in a folder, repeatable (default: "
                        f"{' '.join(DEFAULT_GLOBS)}); hidden files and folders are skipped")
    p.add_argument("--tokenizer", default="bpe", metavar="KIND",
                   help="bpe: a byte-level BPE trained on this text (default, offline); gpt2: GPT-2's "
                        "(Hugging Face Hub, needs the network or its cache); or the path/URL of a tokenizer.json")
    p.add_argument("--vocab-size", type=int, metavar="N",
                   help=f"vocabulary of the trained BPE, {MIN_VOCAB}..{MAX_VOCAB} (uint16 ids; default "
                        f"{DEFAULT_VOCAB}); small text may yield fewer")
    p.add_argument("--val-fraction", type=float, default=0.1, metavar="F",
                   help="share of tokens held out as val.bin, at a document boundary when one lies near, else the"
                        " tail (default 0.1; 0 writes no val.bin)")
    p.add_argument("--train-bytes", type=int, default=DEFAULT_TRAIN_BYTES, metavar="N",
                   help=f"train the BPE on at most the first N bytes of text (default {DEFAULT_TRAIN_BYTES}; "
                        "0 = all); all of it is tokenized")
    p.add_argument("--strict-utf8", action="store_true",
                   help="refuse input holding bytes that are not UTF-8 (default: replace them by U+FFFD, with a warning"
                   " that counts them)")
    p.add_argument("--quiet", action="store_true", help="no progress bars (they show only on a terminal anyway)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``ddp-tokenize``; returns the exit code (2 for a refusal)."""
    args = build_parser().parse_args(argv)
    try:
        return run(args)
    except UsageError as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted; nothing was written (temporary files removed)", file=sys.stderr)
        return 130
    except OSError as exc:  # disk full, permissions, a lost connection: not a usage problem, still one line
        print(f"{PROG}: failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


def say(msg: str) -> None:
    """A status line on stderr (stdout carries only the final summary)."""
    print(f"{PROG}: {msg}", file=sys.stderr, flush=True)


def _check_options(args: argparse.Namespace) -> None:
    """Refuse (UsageError) options that cannot work, before any file is read."""
    if not 0.0 <= args.val_fraction < 1.0:
        raise UsageError("--val-fraction", args.val_fraction, "must be in [0, 1)", "e.g. --val-fraction 0.1")
    if args.train_bytes < 0:
        raise UsageError("--train-bytes", args.train_bytes, "must be >= 0", "pass a byte count, or 0 for all")
    if args.tokenizer == "bpe":
        vocab = DEFAULT_VOCAB if args.vocab_size is None else args.vocab_size
        if vocab > MAX_VOCAB:
            raise UsageError("--vocab-size", vocab, f"too large for uint16 token files, which take a vocabulary of"
                             f" at most {MAX_VOCAB}", f"pass --vocab-size {MAX_VOCAB} or less (e.g. {DEFAULT_VOCAB})")
        if vocab < MIN_VOCAB:
            raise UsageError("--vocab-size", vocab, f"too small: a byte-level BPE starts from 256 byte tokens plus"
                             f" {EOT}", f"pass --vocab-size {MIN_VOCAB} or more (e.g. {DEFAULT_VOCAB})")
    elif args.vocab_size is not None:
        say(f"note: --vocab-size applies to --tokenizer bpe only; {args.tokenizer}'s own vocabulary is used")
    if args.glob is not None and not all(g.strip() for g in args.glob):
        raise UsageError("--glob", args.glob, "an empty pattern matches nothing", "e.g. --glob '*.txt'")


def _output(out_url: str) -> tuple[Any, str]:
    """The output folder's filesystem and path (UsageError when it cannot be one)."""
    try:
        out_fs, out_root = fsspec.core.url_to_fs(out_url)
    except (ImportError, ValueError) as exc:
        raise UsageError("--out", out_url, f"cannot be opened ({exc})",
                         "pass a local folder or an fsspec URL whose backend is installed") from exc
    if out_fs.isfile(out_root):
        raise UsageError("--out", out_url, "is a file; the output is a folder of four files",
                         "pass a folder (it is created if missing)")
    return out_fs, out_root


def _tokenizer(args: argparse.Namespace, fs: Any, sources: list[Any]) -> tuple[Any, dict[str, Any], int, int | None]:
    """The tokenizer, what it is, its vocabulary size (it must fit uint16 ids) and its end-of-text id."""
    tok, tok_info = load_tokenizer(args, fs, sources)
    vocab_size = tokenizer_vocab_size(tok)
    if vocab_size > MAX_VOCAB:
        raise UsageError("--tokenizer", args.tokenizer, f"its vocabulary of {vocab_size} does not fit uint16 ids",
                         f"use a tokenizer with at most {MAX_VOCAB} tokens, or the default --tokenizer bpe")
    eot_id = tok.token_to_id(EOT)
    if eot_id is None:
        say(f"note: the tokenizer has no {EOT} token: documents are concatenated without a separator")
    return tok, tok_info, vocab_size, eot_id


def run(args: argparse.Namespace) -> int:
    """Validate the options, find the text, get a tokenizer, encode, split and write. Raises UsageError."""
    _check_options(args)
    fs, root = _input_fs(args.input)
    out_url = args.out or default_out(root)
    out_fs, out_root = _output(out_url)
    globs = tuple(args.glob or DEFAULT_GLOBS)
    exclude = out_root.rstrip("/") + "/" if type(out_fs) is type(fs) else None
    sources = find_sources(fs, root, args.input, globs, exclude)
    total = sum(s.size for s in sources)
    check_text(fs, sources, args.input)
    say(f"{len(sources)} file(s), {_human(total)} of text from {args.input}")
    tok, tok_info, vocab_size, eot_id = _tokenizer(args, fs, sources)

    local_out, local_in = _is_local(out_fs), _is_local(fs)
    # Local output: build beside the final files (same filesystem, so the renames are atomic). Remote output:
    # build in a local temporary folder, then upload.
    work = Path(out_root) if local_out else Path(tempfile.mkdtemp(prefix="ddp-tokenize-"))
    made_out = local_out and not work.exists()
    work.mkdir(parents=True, exist_ok=True)
    done = False
    tmp_tag = f".tmp-{os.getpid()}"
    temps = [work / f"{name}{tmp_tag}" for name in ("tokens.bin", "val.bin", "tokenizer.json", layout.TOKENS_META)]
    try:
        enc = encode(tok, fs, sources, total, eot_id, temps[0], quiet=args.quiet)
        _undecodable(enc, args)
        if enc.n_tokens == 0:
            raise UsageError("input", args.input, "the text gave no tokens", "give it some text")
        n_train, split_how = choose_split(enc.n_tokens, enc.doc_ends, args.val_fraction)
        n_val = enc.n_tokens - n_train
        _split_file(temps[0], temps[1], n_train, n_val)
        tok.encode_special_tokens = False  # a runtime switch for encode() only: save the tokenizer as it was
        temps[2].write_text(tok.to_str(), encoding="utf-8")
        meta = {
            "vocab_size": vocab_size,
            "tokens": {"train": n_train, "val": n_val},
            "files": {"train": "train.bin", **({"val": "val.bin"} if n_val else {})},
            "dtype": "uint16",
            "byte_order": "little",
            "source": root if local_in else args.input,  # absolute when local: the name alone says little
            "source_sha256": enc.sha256,
            "source_files": len(sources),
            "source_bytes": total,
            "globs": list(globs) if fs.isdir(root) else None,
            "tokenizer": tok_info,
            "eot_id": eot_id,
            "documents": len(enc.doc_ends),
            "val_fraction": args.val_fraction,
            "split": split_how,
            "created": datetime.now(UTC).isoformat(timespec="seconds"),
            "tool": PROG,
        }
        temps[3].write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
        publish(out_fs, out_root, local_out, {"train.bin": temps[0], "val.bin": temps[1] if n_val else None,
                                               "tokenizer.json": temps[2], layout.TOKENS_META: temps[3]})
        done = True
    finally:
        for t in temps:
            t.unlink(missing_ok=True)
        if not local_out:
            shutil.rmtree(work, ignore_errors=True)
        elif made_out and not done and not any(work.iterdir()):
            work.rmdir()  # a failed run leaves no empty output folder behind
    _say_done(_display_url(out_url, out_fs, out_root), n_train, n_val, vocab_size)
    return 0


def _say_done(shown: str, n_train: int, n_val: int, vocab_size: int) -> None:
    val_part = f" + {n_val:,} val" if n_val else " (no val.bin: --val-fraction 0 or too little text)"
    print(f"{PROG}: wrote {n_train:,} train{val_part} tokens, vocabulary {vocab_size}, to {shown}")
    train_cmd = f"ddp-run task=gpt data.path={shown}/train.bin"
    if n_val:
        train_cmd += f" data.val_path={shown}/val.bin"
    print(f"Train on it: {train_cmd} task.model.vocab={-(-vocab_size // 128) * 128}")


def default_out(input_path: str) -> str:
    """``./<input name without suffix>-tokens``, in the current folder wherever the input lives (a remote
    input is not written beside). ``input_path`` is the input's path on its filesystem (absolute if local)."""
    name = input_path.rstrip("/").rsplit("/", 1)[-1]
    stem = name.lstrip(".").split(".")[0]
    return str(Path.cwd() / f"{stem or 'input'}-tokens")


def _input_fs(url: str) -> tuple[Any, str]:
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


def _undecodable(enc: Encoded, args: argparse.Namespace) -> None:
    """Say how many bytes were not UTF-8 (and where), or refuse them with --strict-utf8."""
    if not enc.undecodable:
        return
    count = sum(enc.undecodable.values())
    files = ", ".join(f"{rel} ({n})" for rel, n in list(enc.undecodable.items())[:5])
    more = f" and {len(enc.undecodable) - 5} more files" if len(enc.undecodable) > 5 else ""
    if args.strict_utf8:
        raise UsageError("input", args.input, f"holds {count} bytes that are not UTF-8 (in {files}{more})",
                         "convert the files to UTF-8 (e.g. iconv -f latin1 -t utf-8), or drop --strict-utf8 to"
                         " replace those bytes by U+FFFD")
    say(f"warning: {count} bytes that are not UTF-8 were replaced by U+FFFD (in {files}{more}); --strict-utf8"
        " refuses such input")


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


def load_tokenizer(args: argparse.Namespace, fs: Any, sources: list[Source]) -> tuple[Any, dict[str, Any]]:
    """The tokenizer ``--tokenizer`` names (training it when ``bpe``) and its description for meta.json."""
    try:
        from tokenizers import Tokenizer
    except ImportError as exc:
        raise UsageError("--tokenizer", args.tokenizer, "the 'tokenizers' package is not installed",
                         "pip install tokenizers") from exc
    kind = args.tokenizer
    if kind == "bpe":
        vocab = DEFAULT_VOCAB if args.vocab_size is None else args.vocab_size
        tok = train_bpe(fs, sources, vocab, args.train_bytes, quiet=args.quiet)
        return tok, {"kind": "bpe", "name": "byte-level BPE trained on the source", "vocab_size_requested": vocab,
                     "train_bytes": args.train_bytes or None}
    if kind == "gpt2":
        import logging

        say("loading GPT-2's tokenizer (Hugging Face cache or Hub)...")
        # The hub logs every retry of an unreachable host; the one-line refusal below says it all.
        logging.getLogger("huggingface_hub").setLevel(logging.ERROR)
        try:
            return Tokenizer.from_pretrained("gpt2"), {"kind": "pretrained", "name": "gpt2"}
        except Exception as exc:  # noqa: BLE001 - network, hub and cache errors all mean "not available"
            raise UsageError("--tokenizer", "gpt2",
                             "GPT-2's tokenizer is neither in the Hugging Face cache nor downloadable from the Hub"
                             f" ({type(exc).__name__}; no network?)",
                             "connect to the network once (it is cached after), pass --tokenizer <path to a"
                             " tokenizer.json>, or use the default --tokenizer bpe (trained offline)") from None
    try:
        tfs, tpath = fsspec.core.url_to_fs(kind)
        exists = tfs.isfile(tpath)
    except (ImportError, ValueError, OSError):
        exists = False
    if not exists:
        raise UsageError("--tokenizer", kind, "is neither bpe, gpt2 nor an existing tokenizer.json file",
                         "pass --tokenizer bpe (default), --tokenizer gpt2, or the path of a tokenizer.json")
    try:
        with tfs.open(tpath, "r", encoding="utf-8") as f:
            tok = Tokenizer.from_str(f.read())
    except Exception as exc:  # noqa: BLE001 - the Rust side raises plain Exception on a bad file
        raise UsageError("--tokenizer", kind, f"is not a tokenizers tokenizer.json ({exc})",
                         "pass a tokenizer.json saved by the Hugging Face tokenizers library") from None
    return tok, {"kind": "file", "name": kind.rstrip("/").rsplit("/", 1)[-1], "path": kind}


def train_bpe(fs: Any, sources: list[Source], vocab: int, train_bytes: int, quiet: bool = False) -> Any:
    """A byte-level BPE (GPT-2's scheme: any text encodes, nothing is unknown) trained on the sources' text.

    Learns from at most ``train_bytes`` bytes (0 = all), in document order; ``<|endoftext|>`` is id 0.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=[EOT],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=not quiet and sys.stderr.isatty())
    budget = train_bytes or sum(s.size for s in sources)

    def pieces() -> Iterator[str]:
        left = budget
        for s in sources:
            for text in read_text(fs, s.path):
                yield text
                left -= len(text)  # characters: close enough to bytes for a budget
                if left <= 0:
                    return

    say(f"training a byte-level BPE of vocabulary {vocab} on {_human(min(budget, sum(s.size for s in sources)))}"
        " of text...")
    tok.train_from_iterator(pieces(), trainer, length=max(1, budget // CHUNK_BYTES))
    return tok


def tokenizer_vocab_size(tok: Any) -> int:
    """One more than the largest id the tokenizer can emit (its vocabulary may have gaps)."""
    ids = tok.get_vocab(with_added_tokens=True).values()
    return max(tok.get_vocab_size(with_added_tokens=True), max(ids, default=-1) + 1)


def encode(tok: Any, fs: Any, sources: list[Source], total: int, eot_id: int | None, out: Path,
           quiet: bool = False) -> Encoded:
    """Tokenize every source into ``out`` (uint16), ``eot_id`` after each document; hash the bytes read."""
    import numpy as np
    from tqdm import tqdm

    # Text that spells "<|endoftext|>" is text: only the separators written here are the special token.
    tok.encode_special_tokens = True
    encode_batch = getattr(tok, "encode_batch_fast", tok.encode_batch)  # no offsets: faster (tokenizers>=0.20)
    hasher = hashlib.sha256()
    result = Encoded(str(out), 0)
    batch: list[tuple[str, bool]] = []  # (text, ends its document)
    batch_bytes = 0

    def flush(f: Any) -> None:
        nonlocal batch, batch_bytes
        if not batch:
            return
        for (_, last), e in zip(batch, encode_batch([t for t, _ in batch], add_special_tokens=False), strict=True):
            ids = np.asarray(e.ids, dtype=np.uint16)  # every id < MAX_VOCAB, checked before encoding
            if last and eot_id is not None:
                ids = np.append(ids, np.uint16(eot_id))
            ids.astype("<u2", copy=False).tofile(f)
            result.n_tokens += len(ids)
            if last:
                result.doc_ends.append(result.n_tokens)
        batch, batch_bytes = [], 0

    with open(out, "wb") as f, tqdm(total=total, unit="B", unit_scale=True, desc="tokenizing",
                                    disable=True if quiet else None, file=sys.stderr) as bar:
        for s in sources:
            before = _REPLACED[0]
            pieces = read_text(fs, s.path, hasher=hasher, progress=bar)
            prev = next(pieces, None)
            while prev is not None:  # look one ahead to know which piece ends the document
                nxt = next(pieces, None)
                batch.append((prev, nxt is None))
                batch_bytes += len(prev)
                if batch_bytes >= BATCH_BYTES:
                    flush(f)
                prev = nxt
            if _REPLACED[0] > before:
                result.undecodable[s.rel] = _REPLACED[0] - before
        flush(f)
    result.sha256 = hasher.hexdigest()
    return result


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


def _split_file(tokens: Path, val: Path, n_train: int, n_val: int) -> None:
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


def _is_local(fs: Any) -> bool:
    from fsspec.implementations.local import LocalFileSystem

    return isinstance(fs, LocalFileSystem)


def _display_url(url: str, fs: Any, root: str) -> str:
    """The output as a user would pass it to ddp-run: absolute for local folders, the URL otherwise."""
    return str(Path(root).resolve()) if _is_local(fs) else url.rstrip("/")


def _human(n: int) -> str:
    """Bytes for people: 950 B, 12.3 MB."""
    if n < 1000:
        return f"{n} B"
    size, units = float(n), ("KB", "MB", "GB", "TB")
    for unit in units:
        size /= 1000
        if size < 1000 or unit == units[-1]:
            break
    return f"{size:.1f} {unit}"


if __name__ == "__main__":
    sys.exit(main())
