"""``ddp-tokenize``'s command line and the order of one run: check the options, find the text, get a tokenizer,
encode, split, write meta.json, publish (the package's docstring says what it makes)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import fsspec

from ddp_runner.contract import command_line, console_streams, layout, textfit
from ddp_runner.data.tokenize.bpe import load_tokenizer, tokenizer_vocab_size
from ddp_runner.data.tokenize.encode import Encoded, encode
from ddp_runner.data.tokenize.sources import Source, check_text, default_out, find_sources, input_fs
from ddp_runner.data.tokenize.usage import (
    DEFAULT_GLOBS,
    DEFAULT_TRAIN_BYTES,
    DEFAULT_VOCAB,
    EOT,
    EXIT_USAGE,
    MAX_VOCAB,
    MIN_VOCAB,
    PROG,
    UsageError,
    human,
    say,
)
from ddp_runner.data.tokenize.write import choose_split, display_url, is_local, publish, split_file


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
    console_streams.guard()  # a closed pipe or an ASCII console never ends it (docs/run-tree.md)
    args = build_parser().parse_args(argv)
    try:
        return run(args)
    except UsageError as err:
        textfit.say(f"{PROG}: error: {err}", sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        textfit.say(f"{PROG}: interrupted; nothing was written (temporary files removed)", sys.stderr)
        return 130
    except OSError as exc:  # disk full, permissions, a lost connection: not a usage problem, still one line
        textfit.say(f"{PROG}: failed: {type(exc).__name__}: {exc}", sys.stderr)
        return 1


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


def _tokenizer(args: argparse.Namespace, fs: Any, sources: list[Any]) -> _TokenizerChoice:
    """The tokenizer, what it is, its vocabulary size (it must fit uint16 ids) and its end-of-text id."""
    tok, tok_info = load_tokenizer(args, fs, sources)
    vocab_size = tokenizer_vocab_size(tok)
    if vocab_size > MAX_VOCAB:
        raise UsageError("--tokenizer", args.tokenizer, f"its vocabulary of {vocab_size} does not fit uint16 ids",
                         f"use a tokenizer with at most {MAX_VOCAB} tokens, or the default --tokenizer bpe")
    eot_id = tok.token_to_id(EOT)
    if eot_id is None:
        say(f"note: the tokenizer has no {EOT} token: documents are concatenated without a separator")
    return _TokenizerChoice(tok, tok_info, vocab_size, eot_id)


def run(args: argparse.Namespace) -> int:
    """Validate the options, find the text, get a tokenizer, encode, split and write. Raises UsageError."""
    _check_options(args)
    fs, root = input_fs(args.input)
    out_url = args.out or default_out(root)
    out_fs, out_root = _output(out_url)
    text = _find_text(args, fs, root, out_fs, out_root)
    tok = _tokenizer(args, fs, text.sources)
    local_out = is_local(out_fs)
    # Local output: build beside the final files (same filesystem, so the renames are atomic). Remote output:
    # build in a local temporary folder, then upload.
    work = Path(out_root) if local_out else Path(tempfile.mkdtemp(prefix="ddp-tokenize-"))
    made_out = local_out and not work.exists()
    work.mkdir(parents=True, exist_ok=True)
    done = False
    tmp_tag = f".tmp-{os.getpid()}"
    temps = [work / f"{name}{tmp_tag}" for name in ("tokens.bin", "val.bin", "tokenizer.json", layout.TOKENS_META)]
    try:
        n_train, n_val = _write(args, text, tok, temps)
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
    _say_done(display_url(out_url, out_fs, out_root), n_train, n_val, tok.vocab_size)
    return 0


@dataclass(frozen=True)
class _Text:
    """The text to tokenize: its filesystem and path, its files, their bytes, and the patterns that chose them."""

    fs: Any
    root: str
    sources: list[Source]
    total: int
    globs: tuple[str, ...]


@dataclass(frozen=True)
class _TokenizerChoice:
    """The tokenizer, what it is (meta.json's ``tokenizer``), its vocabulary size and its end-of-text id."""

    tok: Any
    info: dict[str, Any]
    vocab_size: int
    eot_id: int | None


def _find_text(args: argparse.Namespace, fs: Any, root: str, out_fs: Any, out_root: str) -> _Text:
    """The input's text files (never the output folder's), refused when binary."""
    globs = tuple(args.glob or DEFAULT_GLOBS)
    exclude = out_root.rstrip("/") + "/" if type(out_fs) is type(fs) else None
    sources = find_sources(fs, root, args.input, globs, exclude)
    total = sum(s.size for s in sources)
    check_text(fs, sources, args.input)
    say(f"{len(sources)} file(s), {human(total)} of text from {args.input}")
    return _Text(fs, root, sources, total, globs)


def _write(args: argparse.Namespace, text: _Text, tok: _TokenizerChoice, temps: list[Path]) -> tuple[int, int]:
    """Encode into ``temps[0]``, move its val tail to ``temps[1]``, save the tokenizer (``temps[2]``) and meta.json
    (``temps[3]``); returns the train and val token counts."""
    enc = encode(tok.tok, text.fs, text.sources, text.total, tok.eot_id, temps[0], quiet=args.quiet)
    _undecodable(enc, args)
    if enc.n_tokens == 0:
        raise UsageError("input", args.input, "the text gave no tokens", "give it some text")
    n_train, split_how = choose_split(enc.n_tokens, enc.doc_ends, args.val_fraction)
    n_val = enc.n_tokens - n_train
    split_file(temps[0], temps[1], n_train, n_val)
    tok.tok.encode_special_tokens = False  # a runtime switch for encode() only: save the tokenizer as it was
    temps[2].write_text(tok.tok.to_str(), encoding="utf-8")
    meta = _meta(args, text, tok, enc, (n_train, n_val), split_how)
    temps[3].write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    return n_train, n_val


def _meta(args: argparse.Namespace, text: _Text, tok: _TokenizerChoice, enc: Encoded, counts: tuple[int, int],
          split_how: dict[str, Any]) -> dict[str, Any]:
    """meta.json: what the files hold and where they came from (``ddp-run`` reads it before launch)."""
    n_train, n_val = counts
    return {
        "vocab_size": tok.vocab_size,
        "tokens": {"train": n_train, "val": n_val},
        "files": {"train": "train.bin", **({"val": "val.bin"} if n_val else {})},
        "dtype": "uint16",
        "byte_order": "little",
        "source": text.root if is_local(text.fs) else args.input,  # absolute when local: the name alone says little
        "source_sha256": enc.sha256,
        "source_files": len(text.sources),
        "source_bytes": text.total,
        "globs": list(text.globs) if text.fs.isdir(text.root) else None,
        "tokenizer": tok.info,
        "eot_id": tok.eot_id,
        "documents": len(enc.doc_ends),
        "val_fraction": args.val_fraction,
        "split": split_how,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "tool": PROG,
    }


def _say_done(shown: str, n_train: int, n_val: int, vocab_size: int) -> None:
    val_part = f" + {n_val:,} val" if n_val else " (no val.bin: --val-fraction 0 or too little text)"
    textfit.say(f"{PROG}: wrote {n_train:,} train{val_part} tokens, vocabulary {vocab_size}, to {shown}")
    paths = [command_line.override("data.path", f"{shown}/train.bin")]
    if n_val:
        paths.append(command_line.override("data.val_path", f"{shown}/val.bin"))
    train = command_line.ddp_run("task=gpt", *paths, f"task.model.vocab={-(-vocab_size // 128) * 128}")
    # On a terminal the command goes on a line of its own, continued with backslashes so that it still pastes;
    # piped, one line for scripts.
    textfit.say(f"Train on it:\n  {train}" if textfit.terminal_width(sys.stdout) else f"Train on it: {train}")


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
