"""ddp-tokenize's tokenizers: a byte-level BPE trained on the text itself, GPT-2's, or a saved tokenizer.json."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from typing import Any

import fsspec

from ddp_runner.data.tokenize.sources import CHUNK_BYTES, Source, read_text
from ddp_runner.data.tokenize.usage import DEFAULT_VOCAB, EOT, UsageError, human, say


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

    say(f"training a byte-level BPE of vocabulary {vocab} on {human(min(budget, sum(s.size for s in sources)))}"
        " of text...")
    tok.train_from_iterator(pieces(), trainer, length=max(1, budget // CHUNK_BYTES))
    return tok


def tokenizer_vocab_size(tok: Any) -> int:
    """One more than the largest id the tokenizer can emit (its vocabulary may have gaps)."""
    ids = tok.get_vocab(with_added_tokens=True).values()
    return max(tok.get_vocab_size(with_added_tokens=True), max(ids, default=-1) + 1)
