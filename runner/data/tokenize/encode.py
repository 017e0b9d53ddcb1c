"""ddp-tokenize's encoding pass: every source's text to uint16 ids in one file, an end-of-text id after each
document, the input's bytes hashed on the way."""

from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddp_runner.data.tokenize.sources import Source, read_text, replaced_bytes

# Text handed to the tokenizer per encode call (pieces are encoded in parallel by the tokenizers library within a
# call).
BATCH_BYTES = 16 << 20


@dataclass
class Encoded:
    """What the encoding pass produced: ids in ``tokens_file``, documents' end offsets, the input's sha256."""

    tokens_file: str
    n_tokens: int
    doc_ends: list[int] = field(default_factory=list)
    sha256: str = ""
    undecodable: dict[str, int] = field(default_factory=dict)  # bytes that were not UTF-8, by source file

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
            before = replaced_bytes()
            pieces = read_text(fs, s.path, hasher=hasher, progress=bar)
            prev = next(pieces, None)
            while prev is not None:  # look one ahead to know which piece ends the document
                nxt = next(pieces, None)
                batch.append((prev, nxt is None))
                batch_bytes += len(prev)
                if batch_bytes >= BATCH_BYTES:
                    flush(f)
                prev = nxt
            if replaced_bytes() > before:
                result.undecodable[s.rel] = replaced_bytes() - before
        flush(f)
    result.sha256 = hasher.hexdigest()
    return result
