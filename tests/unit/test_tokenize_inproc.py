"""ddp-tokenize: a real BPE trained on real text, files and meta.json checked byte for byte, refusals, and
a real 2-rank run on the output (through the CLI)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import fsspec
import pytest

from ddp_runner.data import tokenize


def test_fsspec_urls_in_and_out_and_rewrite_without_val() -> None:
    base = f"memory://tok-{uuid.uuid4().hex}"
    for i in range(10):  # ten like documents: the last one is the 10 % held out
        with fsspec.open(f"{base}/in/part{i}.txt", "w") as f:
            f.write(f"document {i}: " + "the quick brown fox jumps over the lazy dog. " * 80 + "\n")
    assert tokenize.main([f"{base}/in", "--out", f"{base}/out", "--vocab-size", "300", "--quiet"]) == 0
    fs = fsspec.filesystem("memory")
    meta = json.loads(fs.cat(f"{base}/out/meta.json"))
    assert meta["source"] == f"{base}/in" and meta["split"] == {"method": "documents", "val_documents": 1}
    assert fs.size(f"{base}/out/val.bin") == 2 * meta["tokens"]["val"]
    # Again with no validation share: the stale val.bin goes, meta.json no longer lists it.
    assert tokenize.main([f"{base}/in", "--out", f"{base}/out", "--val-fraction", "0", "--quiet"]) == 0
    assert not fs.exists(f"{base}/out/val.bin")
    meta = json.loads(fs.cat(f"{base}/out/meta.json"))
    assert meta["files"] == {"train": "train.bin"} and meta["tokens"]["val"] == 0


@pytest.mark.parametrize(
    ("args", "option", "words"),
    [
        (["{d}/missing"], "input", "not found"),
        (["{d}/empty.txt"], "input", "empty file"),
        (["{d}/nothing"], "input", "--glob"),
        (["{d}/blank"], "input", "all empty"),
        (["{d}/ok.txt", "--vocab-size", "70000"], "--vocab-size", "65535"),
        (["{d}/ok.txt", "--vocab-size", "100"], "--vocab-size", "257"),
        (["{d}/ok.txt", "--val-fraction", "1"], "--val-fraction", "[0, 1)"),
        (["{d}/ok.txt", "--tokenizer", "{d}/nope.json"], "--tokenizer", "tokenizer.json"),
        (["{d}/ok.txt", "--tokenizer", "{d}/ok.txt"], "--tokenizer", "not a tokenizers tokenizer.json"),
        (["{d}/ok.txt", "--out", "{d}/ok.txt"], "--out", "is a file"),
    ],
)
def test_bad_input_is_refused_with_option_value_and_fix(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                        args: list[str], option: str, words: str) -> None:
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "nothing").mkdir()
    (tmp_path / "nothing" / "data.csv").write_text("1,2\n")
    (tmp_path / "blank").mkdir()
    (tmp_path / "blank" / "a.txt").write_text("")
    (tmp_path / "ok.txt").write_text("some text\n" * 50)
    argv = [a.format(d=tmp_path) for a in args]
    if "--out" not in argv:
        argv += ["--out", str(tmp_path / "out")]
    assert tokenize.main([*argv, "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"ddp-tokenize: error: {option}=") and words in err and "Fix: " in err
    assert not (tmp_path / "out").exists()  # nothing written, not even an empty folder
