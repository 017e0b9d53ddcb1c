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

The package's modules: ``cli`` (the command and the run's order), ``usage`` (its terms and refusal), ``sources``
(finding and reading the text), ``bpe`` (the tokenizers), ``encode`` (text to ids), ``write`` (split and publish).
The on-disk format is what ``runner/contract/corpus.py`` reads on the worker side.
"""

from ddp_runner.data.tokenize.bpe import load_tokenizer, tokenizer_vocab_size, train_bpe
from ddp_runner.data.tokenize.cli import build_parser, main, run
from ddp_runner.data.tokenize.encode import Encoded, encode
from ddp_runner.data.tokenize.sources import Source, binary_kind, check_text, default_out, find_sources, read_text
from ddp_runner.data.tokenize.usage import EOT, MAX_VOCAB, MIN_VOCAB, PROG, UsageError
from ddp_runner.data.tokenize.write import choose_split, publish

__all__ = ["EOT", "MAX_VOCAB", "MIN_VOCAB", "PROG", "Encoded", "Source", "UsageError", "binary_kind", "build_parser",
           "check_text", "choose_split", "default_out", "encode", "find_sources", "load_tokenizer", "main", "publish",
           "read_text", "run", "tokenizer_vocab_size", "train_bpe"]
