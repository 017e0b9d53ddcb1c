"""Pre-launch data checks: unusable token files refused by key, ids beyond the model's vocabulary found (meta.json
or a scan), and describe() for run.json."""

from __future__ import annotations

import hashlib
import json
import uuid
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pytest

from ddp_runner.contract import corpus
from ddp_runner.contract.errors import PlanError
from ddp_runner.data import prep as data_prep
from ddp_runner.tasks.gpt import checks

TASK = {"model": {"context": 16}}


def text_data(path: str | None, **kw: Any) -> dict[str, Any]:
    return {"name": "text", "path": path, "val_path": None, "format": "auto", "val_fraction": 0.1, "vocab": None,
            **kw}


def write_tokens(path: Path, tokens: np.ndarray | list[int], meta: dict[str, Any] | None = None) -> str:
    np.asarray(tokens, dtype="<u2").tofile(path)
    if meta is not None:
        (path.parent / "meta.json").write_text(json.dumps(meta))
    return str(path)


def refusal(data: dict[str, Any]) -> PlanError:
    with pytest.raises(PlanError) as e:
        data_prep.prepare(data, TASK)
    return e.value


def test_val_path_counts_whole_files(tmp_path: Path) -> None:
    train = write_tokens(tmp_path / "train.bin", np.arange(1000))
    val = write_tokens(tmp_path / "val.bin", np.arange(170))
    # The whole of data.path trains (val_fraction unused), the whole of val_path validates.
    assert data_prep.prepare(text_data(train, val_path=val, val_fraction=0.5), TASK) == (1000 - 1) // 16
    assert corpus.count_samples(train, "auto", 16, 0.5, val) == (62, 10)
    assert data_prep.prepare(text_data(train), TASK) == (900 - 1) // 16  # no val_path: the tail split stays


def test_directory_is_refused_with_the_files_inside(tmp_path: Path) -> None:
    write_tokens(tmp_path / "train.bin", np.arange(100))
    write_tokens(tmp_path / "val.bin", np.arange(100))
    err = refusal(text_data(str(tmp_path)))
    assert (err.key, err.problem) == ("data.path", "is a directory, not a token file")
    assert f"data.path={tmp_path}/train.bin data.val_path={tmp_path}/val.bin" in err.fix
    err = refusal(text_data(str(tmp_path / "train.bin"), val_path=str(tmp_path)))
    assert err.key == "data.val_path" and f"data.val_path={tmp_path}/val.bin" in err.fix


@pytest.mark.parametrize("key", ["data.path", "data.val_path"])
def test_missing_empty_and_odd_files_are_refused(tmp_path: Path, key: str) -> None:
    good = write_tokens(tmp_path / "good.bin", np.arange(500))
    (tmp_path / "empty.bin").write_bytes(b"")
    (tmp_path / "odd.bin").write_bytes(b"\x01\x00\x02")
    field = "path" if key == "data.path" else "val_path"
    for name, words in (("missing.bin", "not found"), ("empty.bin", "is empty"), ("odd.bin", "odd number")):
        data = {**text_data(good), field: str(tmp_path / name)}
        err = refusal(data)
        assert err.key == key and err.value == str(tmp_path / name) and words in err.problem, err
        assert err.fix
    # Odd bytes are fine as bytes: the same file named .txt is byte-level text.
    (tmp_path / "odd.txt").write_bytes(b"x" * 33)
    assert data_prep.prepare(text_data(str(tmp_path / "odd.txt")), TASK) == 1


def test_too_small_for_one_sample_names_the_file_not_the_batch(tmp_path: Path) -> None:
    small = write_tokens(tmp_path / "small.bin", np.arange(16))  # 16 tokens: a sample needs 17
    err = refusal(text_data(small, val_fraction=0.0))
    assert err.key == "data.path" and "16 uint16 tokens" in err.problem and "needs 17" in err.problem
    # With the tail split, the training part is what falls short: say so.
    ok = write_tokens(tmp_path / "ok.bin", np.arange(20))
    err = refusal(text_data(ok, val_fraction=0.2))
    assert err.key == "data.path" and "20 uint16 tokens (16 for training" in err.problem
    big = write_tokens(tmp_path / "big.bin", np.arange(100))
    err = refusal(text_data(big, val_path=small))
    assert err.key == "data.val_path" and "one validation sample" in err.problem


def test_bad_format_and_val_fraction_are_refused(tmp_path: Path) -> None:
    path = write_tokens(tmp_path / "t.bin", np.arange(100))
    assert refusal(text_data(path, format="int8")).key == "data.format"
    assert refusal(text_data(path, val_fraction=1.0)).key == "data.val_fraction"
    # Unused with val_path: not refused.
    assert data_prep.prepare(text_data(path, val_path=path, val_fraction=1.0), TASK) == 6


def gpt_cfg(data: dict[str, Any], vocab: int) -> dict[str, Any]:
    model = {"layers": 1, "heads": 1, "width": 8, "context": 16, "vocab": vocab, "dropout": 0.0}
    return {"task": {"model": model}, "data": data}


def test_vocab_from_meta_json_or_a_scan(tmp_path: Path) -> None:
    tokens = np.arange(3000) % 700
    (tmp_path / "tok").mkdir()
    meta = {"vocab_size": 1000, "tokens": {"train": 3000}, "files": {"train": "train.bin"}}
    with_meta = write_tokens(tmp_path / "tok" / "train.bin", tokens, meta)
    need = corpus.vocab_needed(text_data(with_meta))
    assert need.size == 1000 and "meta.json" in need.why  # the tokenizer's size, not the largest id seen
    bare = write_tokens(tmp_path / "bare.bin", tokens)
    need = corpus.vocab_needed(text_data(bare))
    assert need.size == 700 and "largest token id 699" in need.why
    # A file the meta.json does not list, or whose size it no longer matches, is scanned instead.
    other = write_tokens(tmp_path / "tok" / "other.bin", [5, 6, 7])
    assert corpus.vocab_needed(text_data(other)).size == 8
    write_tokens(tmp_path / "tok" / "train.bin", [1, 2, 3])
    assert corpus.vocab_needed(text_data(with_meta)).size == 4
    # data.vocab, when set, is the declaration; byte-level text needs 256.
    assert corpus.vocab_needed(text_data(bare, vocab=5000)).size == 5000
    (tmp_path / "a.txt").write_text("x")
    assert corpus.vocab_needed(text_data(str(tmp_path / "a.txt"))).size == 256


def test_val_path_ids_count_too_and_the_check_refuses(tmp_path: Path) -> None:
    train = write_tokens(tmp_path / "train.bin", np.arange(1000) % 300)
    val = write_tokens(tmp_path / "val.bin", [1, 2, 40000, 3])
    data = text_data(train, val_path=val)
    need = corpus.vocab_needed(data)
    assert need.size == 40001 and "data.val_path" in need.why
    with pytest.raises(PlanError) as e:
        checks.check(gpt_cfg(data, vocab=512))
    err = e.value
    assert err.key == "task.model.vocab" and err.value == 512
    assert "40001" in err.problem and "40064" in err.fix  # the need, and a multiple of 128 above it
    checks.check(gpt_cfg(data, vocab=40064))


def test_scan_is_chunked_and_ignores_a_trailing_byte(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(corpus, "_SCAN_CHUNK_TOKENS", 7)
    tokens = np.zeros(100, dtype="<u2")
    tokens[99] = 1234  # in the last, partial chunk
    path = tmp_path / "t.bin"
    path.write_bytes(tokens.tobytes() + b"\xff")
    assert corpus.max_token_id(str(path)) == 1234
    (tmp_path / "one.bin").write_bytes(b"\xff")
    assert corpus.max_token_id(str(tmp_path / "one.bin")) is None


def test_remote_files_are_scanned_when_small(monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"memory://scan-{uuid.uuid4().hex}/t.bin"
    with fsspec.open(url, "wb") as f:
        f.write(np.array([3, 9000, 4] * 1000, dtype="<u2").tobytes() + b"\x00")
    monkeypatch.setattr(corpus, "_SCAN_CHUNK_TOKENS", 100)
    assert corpus.max_token_id(url) == 9000
    assert corpus.vocab_needed(text_data(url)).size == 9001
    monkeypatch.setattr(corpus, "SCAN_REMOTE_MAX_BYTES", 1000)  # too big to read at every launch: unknown
    assert corpus.max_token_id(url) is None and corpus.vocab_needed(text_data(url)) is None


def test_describe_small_files_hashed(tmp_path: Path) -> None:
    (tmp_path / "tok").mkdir()
    meta = {"vocab_size": 300, "tokens": {"train": 200, "val": 50}, "files": {"train": "train.bin", "val": "val.bin"},
            "source_sha256": "ab" * 32}
    train = write_tokens(tmp_path / "tok" / "train.bin", np.arange(200), meta)
    val = write_tokens(tmp_path / "tok" / "val.bin", np.arange(50))
    d = data_prep.describe(text_data(train, val_path=val))
    assert d["path"] == train and d["val_path"] == val and d["format"] == "uint16"
    assert (d["bytes"], d["tokens"]) == (400, 200) and d["identity"] == "sha256"
    assert d["sha256"] == hashlib.sha256(Path(train).read_bytes()).hexdigest()
    assert d["val"]["tokens"] == 50 and d["val"]["sha256"] == hashlib.sha256(Path(val).read_bytes()).hexdigest()
    assert d["vocab_size"] == 300 and d["meta"] == meta and d["mtime"].endswith("+00:00")
    json.dumps(d)  # it goes into run.json as is
    assert data_prep.describe({"name": "synthetic", "num_samples": 8}) is None


def test_describe_large_files_by_size_and_mtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(data_prep, "HASH_MAX_BYTES", 100)
    (tmp_path / "c.txt").write_bytes(b"y" * 101)
    d = data_prep.describe(text_data(str(tmp_path / "c.txt"), val_fraction=0.2))
    assert d["sha256"] is None and d["identity"].startswith("size+mtime") and d["mtime"]
    assert d["format"] == "bytes" and d["vocab_size"] == 256 and d["meta"] is None and d["val"] is None
    assert "val_fraction=0.2" in d["split"]
