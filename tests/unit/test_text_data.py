"""Token-window datasets over fsspec files: formats, URLs, split sizes, window contents, pickling."""

from __future__ import annotations

import pickle
import uuid
from pathlib import Path

import fsspec
import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from ddp_runner.contract.corpus import count_samples, resolve_format
from ddp_runner.tasks.gpt.data import TokenWindows, make_datasets


def data_cfg(path: str | None, fmt: str = "auto", val_fraction: float = 0.1, val_path: str | None = None):
    return OmegaConf.create(dict(name="text", path=path, val_path=val_path, format=fmt, val_fraction=val_fraction))


def check_windows(ds: TokenWindows, tokens: np.ndarray, start: int, context: int) -> None:
    """Every sample is the expected shifted pair, in order, int64."""
    for i in range(len(ds)):
        x, y = ds[i]
        a = start + i * context
        assert x.dtype == torch.int64 and y.dtype == torch.int64
        assert x.shape == (context,) and y.shape == (context,)
        assert torch.equal(x, torch.from_numpy(tokens[a : a + context].astype(np.int64)))
        assert torch.equal(y, torch.from_numpy(tokens[a + 1 : a + context + 1].astype(np.int64)))


def test_resolve_format() -> None:
    assert resolve_format("s3://b/train.bin", "auto") == "uint16"
    assert resolve_format("/x/corpus.txt", "auto") == "bytes"
    assert resolve_format("/x/train.bin", "bytes") == "bytes"
    with pytest.raises(ValueError, match="data.format"):
        resolve_format("/x", "int8")


@pytest.mark.parametrize("n_bytes", [1000, 1001, 1024, 1025])
@pytest.mark.parametrize("context", [7, 16])
def test_bytes_windows_and_split(tmp_path: Path, n_bytes: int, context: int) -> None:
    raw = np.random.default_rng(0).integers(0, 256, n_bytes, dtype=np.uint8)
    path = tmp_path / "corpus.txt"
    path.write_bytes(raw.tobytes())
    train, val = make_datasets(data_cfg(str(path)), context)
    assert (len(train), len(val)) == count_samples(str(path), "auto", context, 0.1)
    n_val = int(n_bytes * 0.1)
    n_train = n_bytes - n_val
    assert len(train) == (n_train - 1) // context and len(val) == (n_val - 1) // context
    check_windows(train, raw, 0, context)
    check_windows(val, raw, n_train, context)
    # Train never reads a val token: its last target sits before the split.
    assert len(train) * context < n_train


def test_uint16_bin_windows(tmp_path: Path) -> None:
    tokens = np.random.default_rng(1).integers(0, 50257, 5001, dtype=np.uint16)
    path = tmp_path / "train.bin"
    tokens.astype("<u2").tofile(path)
    train, val = make_datasets(data_cfg(str(path), val_fraction=0.2), 32)
    assert train.fmt == "uint16"
    assert (len(train), len(val)) == count_samples(str(path), "auto", 32, 0.2)
    check_windows(train, tokens, 0, 32)
    check_windows(val, tokens, 4001, 32)
    assert int(train[0][0].max()) >= 256  # really 16-bit ids, not bytes


def test_uint16_ids_beyond_model_vocab_are_reported(tmp_path: Path) -> None:
    path = tmp_path / "train.bin"
    np.full(200, 300, dtype="<u2").tofile(path)
    train, _ = make_datasets(data_cfg(str(path)), 8, max_token=256)
    with pytest.raises(ValueError, match="token id 300"):
        train[0]


def test_memory_url_uses_ranged_reads() -> None:
    url = f"memory://text-{uuid.uuid4().hex}/train.bin"
    tokens = np.arange(3000, dtype="<u2")
    with fsspec.open(url, "wb") as f:
        f.write(tokens.tobytes())
    train, val = make_datasets(data_cfg(url), 50)
    assert (len(train), len(val)) == count_samples(url, "auto", 50, 0.1)
    check_windows(train, tokens, 0, 50)
    check_windows(val, tokens, 2700, 50)
    assert train._mm is None and train._fh is not None  # not memory-mapped: seek + read
    # Negative indices count from the end, out-of-range ones raise.
    assert torch.equal(train[-1][0], train[len(train) - 1][0])
    with pytest.raises(IndexError):
        train[len(train)]


def test_pickles_without_open_handles(tmp_path: Path) -> None:
    raw = bytes(range(256)) * 20
    path = tmp_path / "corpus.txt"
    path.write_bytes(raw)
    train, _ = make_datasets(data_cfg(str(path)), 16)
    x0, y0 = train[3]  # opens the memmap
    assert train._mm is not None
    blob = pickle.dumps(train)
    assert len(blob) < 2000  # the handle, not the data, was dropped
    clone = pickle.loads(blob)
    assert clone._mm is None
    x1, y1 = clone[3]
    assert torch.equal(x0, x1) and torch.equal(y0, y1)


def test_val_is_none_without_a_window_and_short_data_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "corpus.txt"
    path.write_bytes(b"x" * 100)
    train, val = make_datasets(data_cfg(str(path), val_fraction=0.0), 9)
    assert val is None and len(train) == 11
    assert count_samples(str(path), "auto", 9, 0.0) == (11, 0)
    with pytest.raises(ValueError, match="too few"):
        make_datasets(data_cfg(str(path)), 100)
    with pytest.raises(ValueError, match="val_fraction"):
        make_datasets(data_cfg(str(path), val_fraction=1.0), 9)


def test_val_path_trains_on_all_of_path_and_validates_on_all_of_val_path(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    train_tokens = rng.integers(0, 9000, 3001, dtype=np.uint16)
    val_tokens = rng.integers(0, 9000, 401, dtype=np.uint16)
    train_path, val_path = tmp_path / "train.bin", tmp_path / "val.bin"
    train_tokens.astype("<u2").tofile(train_path)
    val_tokens.astype("<u2").tofile(val_path)
    cfg = data_cfg(str(train_path), val_fraction=0.5, val_path=str(val_path))  # val_fraction unused
    train, val = make_datasets(cfg, 40)
    assert (len(train), len(val)) == (75, 10) == count_samples(str(train_path), "auto", 40, 0.5, str(val_path))
    check_windows(train, train_tokens, 0, 40)
    check_windows(val, val_tokens, 0, 40)
    assert val.url == str(val_path) and val.start == 0


def test_val_path_on_an_fsspec_url_and_too_short(tmp_path: Path) -> None:
    url = f"memory://text-{uuid.uuid4().hex}/val.bin"
    with fsspec.open(url, "wb") as f:
        f.write(np.arange(101, dtype="<u2").tobytes())
    path = tmp_path / "corpus.txt"
    path.write_bytes(bytes(range(256)) * 4)
    train, val = make_datasets(data_cfg(str(path), val_path=url), 10)
    assert (train.fmt, val.fmt) == ("bytes", "uint16")  # each file's own format, by the same rules
    assert (len(train), len(val)) == ((1024 - 1) // 10, 10) == count_samples(str(path), "auto", 10, 0.1, url)
    with pytest.raises(ValueError, match="val_path"):
        make_datasets(data_cfg(str(path), val_path=url), 101)  # 101 tokens: no window of 102
