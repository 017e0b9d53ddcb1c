"""The default corpus: built from the stdlib once, cached, deterministic, atomic; driver-light imports."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from ddp_runner.contract import corpus

SMALL = 300_000  # a small cap keeps these tests fast; the default cap is exercised once below


def test_built_once_then_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    path = corpus.default_corpus_path(SMALL)
    assert Path(path).parent == tmp_path / "ddp-runner" / "corpus"
    first = os.stat(path)
    assert 0 < first.st_size <= SMALL
    os.utime(path, ns=(first.st_atime_ns, first.st_mtime_ns - 10**9))  # make any rewrite visible
    before = os.stat(path).st_mtime_ns
    assert corpus.default_corpus_path(SMALL) == path
    assert os.stat(path).st_mtime_ns == before
    # No temp files left behind.
    assert os.listdir(Path(path).parent) == [Path(path).name]


def test_deterministic_across_builds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "a"))
    a = Path(corpus.default_corpus_path(SMALL)).read_bytes()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "b"))
    b = Path(corpus.default_corpus_path(SMALL)).read_bytes()
    assert a == b
    assert a.startswith(b"# file: ")
    assert b"site-packages" not in a.split(b"\n", 1)[0]


def test_default_size_and_counts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    path = corpus.default_corpus_path()
    size = os.path.getsize(path)
    assert 8_000_000 < size <= corpus.DEFAULT_MAX_BYTES
    # count_samples(path=None) means the default corpus.
    n_val = int(size * 0.1)
    expected = ((size - n_val - 1) // 64, (n_val - 1) // 64)
    assert corpus.count_samples(None, "auto", 64, 0.1) == expected
    assert corpus.count_samples(path, "auto", 64, 0.1) == expected


def test_keyed_by_cap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert corpus.default_corpus_path(SMALL) != corpus.default_corpus_path(SMALL // 2)
    name = Path(corpus.default_corpus_path(SMALL)).name
    assert f"py{sys.version_info.major}.{sys.version_info.minor}." in name


def test_split_arithmetic() -> None:
    assert corpus.split_tokens(1000, 0.1) == (900, 100)
    assert corpus.split_tokens(1000, 0.0) == (1000, 0)
    assert corpus.num_windows(0, 8) == 0 and corpus.num_windows(8, 8) == 0 and corpus.num_windows(9, 8) == 1
    assert corpus.num_windows(17, 8) == 2
    with pytest.raises(ValueError):
        corpus.split_tokens(10, -0.1)


def test_token_ranges_tail_split_or_val_path(tmp_path: Path) -> None:
    (tmp_path / "t.bin").write_bytes(b"\0" * 2001)  # 1000 whole uint16 tokens and a stray byte
    (tmp_path / "v.txt").write_bytes(b"v" * 50)
    t, v = str(tmp_path / "t.bin"), str(tmp_path / "v.txt")
    assert corpus.token_ranges(t, "auto", 0.1) == (corpus.TokenRange(t, "uint16", 0, 900),
                                                   corpus.TokenRange(t, "uint16", 900, 100))
    assert corpus.token_ranges(t, "auto", 0.1, v) == (corpus.TokenRange(t, "uint16", 0, 1000),
                                                      corpus.TokenRange(v, "bytes", 0, 50))
    assert corpus.count_samples(t, "auto", 7, 0.1, v) == (142, 7)
