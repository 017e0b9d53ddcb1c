"""Language-model samples cut from one token stream read through fsspec.

The stream is a file of tokens: raw text as byte-level tokens (vocabulary 256) or pre-tokenized little-endian
uint16 (nanoGPT-style ``.bin``, as ``ddp-tokenize`` writes). Sample ``i`` of a range is the window of
``context + 1`` tokens starting at ``i * context``: ``x`` is its first ``context`` tokens, ``y`` the same shifted
by one. Train is the first ``1 - val_fraction`` of the stream and val the rest, or, with ``val_path``, train is
all of ``path`` and val all of ``val_path``; the arithmetic lives in ``ddp_runner.contract.corpus`` so the driver's
sample counts always equal these datasets' lengths.

Files larger than RAM are fine: local files are memory-mapped, any other URL (s3://, gs://, memory://, ...) is
read window by window with seek + read. Nothing reads the whole file.
"""

from __future__ import annotations

import os
from typing import Any

import fsspec
import numpy as np
import torch
from fsspec.implementations.local import LocalFileSystem
from torch.utils.data import Dataset

from ddp_runner.contract.corpus import ITEMSIZE, default_corpus_path, num_windows, token_count, token_ranges

# Explicit little-endian: a .bin written on one machine must read the same on any other.
_DTYPES = {"bytes": np.dtype(np.uint8), "uint16": np.dtype("<u2")}


class TokenWindows(Dataset):
    """Non-overlapping ``(x, y)`` windows over tokens ``[start, start + n_tokens)`` of a file.

    The file is opened lazily, once per process (a fork or an unpickle reopens it), so the dataset pickles
    cheaply into DataLoader workers and never shares a file offset between processes.
    """

    def __init__(
        self,
        url: str,
        fmt: str,
        context: int,
        start: int,
        n_tokens: int,
        max_token: int | None = None,
    ) -> None:
        """``fmt`` is a concrete format (``bytes``/``uint16``); ``max_token``, if given, bounds token ids."""
        if fmt not in _DTYPES:
            raise ValueError(f"unknown token format {fmt!r}; expected one of {sorted(_DTYPES)}")
        self.url, self.fmt, self.context = url, fmt, context
        self.start, self.n_tokens = start, n_tokens
        self.max_token = max_token
        self._length = num_windows(n_tokens, context)
        self._reset()

    def _reset(self) -> None:
        self._pid: int | None = None
        self._mm: np.memmap | None = None
        self._fh: Any = None

    def __getstate__(self) -> dict[str, Any]:
        # Drop open handles: a pickled memmap would copy the whole array, a file handle does not pickle.
        state = self.__dict__.copy()
        state.update(_pid=None, _mm=None, _fh=None)
        return state

    def __len__(self) -> int:
        return self._length

    def _open(self) -> None:
        fs, path = fsspec.core.url_to_fs(self.url)
        if isinstance(fs, LocalFileSystem):
            self._mm = np.memmap(path, dtype=_DTYPES[self.fmt], mode="r")
        else:
            self._fh = fs.open(path, "rb")
        self._pid = os.getpid()

    def _read(self, first: int, count: int) -> np.ndarray:
        """Tokens ``[first, first + count)`` of the file (absolute token positions)."""
        if self._pid != os.getpid():
            self._reset()
            self._open()
        if self._mm is not None:
            return np.asarray(self._mm[first : first + count])
        itemsize = ITEMSIZE[self.fmt]
        self._fh.seek(first * itemsize)
        raw = self._fh.read(count * itemsize)
        if len(raw) != count * itemsize:
            raise OSError(f"short read from {self.url}: wanted {count * itemsize} bytes, got {len(raw)}")
        return np.frombuffer(raw, dtype=_DTYPES[self.fmt])

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not -self._length <= i < self._length:
            raise IndexError(f"sample {i} out of range for {self._length} samples")
        i %= self._length
        T = self.context
        window = self._read(self.start + i * T, T + 1)
        # A token id >= the model's vocabulary would surface on GPU as an opaque device-side assert; a max
        # over T + 1 integers is free compared with the step, so say what is wrong here instead.
        if self.max_token is not None and int(window.max()) >= self.max_token:
            raise ValueError(
                f"{self.url}: token id {int(window.max())} in sample {i} is >= the model vocabulary "
                f"{self.max_token}; raise task.model.vocab or check data.format"
            )
        tokens = torch.from_numpy(window.astype(np.int64))
        return tokens[:-1], tokens[1:]


def make_datasets(
    data_cfg: Any, context: int, max_token: int | None = None
) -> tuple[TokenWindows, TokenWindows | None]:
    """Build (train, val) datasets from a ``data: text`` config (``path``, ``val_path``, ``format``,
    ``val_fraction``).

    ``data_cfg.path`` is any fsspec URL, or null for the default stdlib corpus. With ``val_path`` set, all of
    ``path`` trains and all of ``val_path`` validates; else val is the ``val_fraction`` tail of ``path``, and
    None when that leaves no complete window. ``max_token`` (the model vocabulary) makes every sample check
    its token ids. Raises ValueError when the training range (or a given ``val_path``) is too short for one
    window.
    """
    url = data_cfg.get("path") or default_corpus_path()
    val_path = data_cfg.get("val_path") or None
    train_range, val_range = token_ranges(url, data_cfg.get("format", "auto"),
                                          float(data_cfg.get("val_fraction", 0.1)), val_path)
    train, val = (TokenWindows(r.url, r.fmt, context, r.start, r.n_tokens, max_token)
                  for r in (train_range, val_range))
    if len(train) == 0:
        held_out = "" if val_path else f" ({train_range.n_tokens} for training)"
        raise ValueError(
            f"{url} holds {token_count(url, train_range.fmt)} {train_range.fmt} tokens{held_out}: too few for one"
            f" sample of context {context} (needs {context + 1})"
        )
    if val_path and len(val) == 0:
        raise ValueError(
            f"data.val_path {val_path} holds {val_range.n_tokens} {val_range.fmt} tokens: too few for one sample"
            f" of context {context} (needs {context + 1})"
        )
    return train, (val if len(val) > 0 else None)
