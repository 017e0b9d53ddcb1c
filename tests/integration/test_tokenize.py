"""ddp-tokenize: a real BPE trained on real text, files and meta.json checked byte for byte, refusals, and
a real 2-rank run on the output (through the CLI)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from ddp_runner.data import tokenize
from tests.support.run_tree import load_json
from tests.support.tokenized import MODULES, STDLIB, tokenize_cli


def read_tokens(path: Path) -> np.ndarray:
    return np.fromfile(path, dtype="<u2")


def test_writes_token_files_meta_and_tokenizer(tokenized) -> None:
    corpus, out, files, r = tokenized
    assert sorted(p.name for p in out.iterdir()) == ["meta.json", "tokenizer.json", "train.bin", "val.bin"]
    meta = load_json(out / "meta.json")
    train, val = read_tokens(out / "train.bin"), read_tokens(out / "val.bin")
    assert meta["dtype"] == "uint16" and meta["vocab_size"] == 1000
    assert meta["tokens"] == {"train": len(train), "val": len(val)}
    assert meta["files"] == {"train": "train.bin", "val": "val.bin"}
    assert max(int(train.max()), int(val.max())) < meta["vocab_size"]
    assert meta["source"] == str(corpus) and meta["source_files"] == len(files) == len(MODULES) + 1
    # The input's hash is that of its files' bytes concatenated in sorted path order (= cat ... | sha256sum).
    assert meta["source_sha256"] == hashlib.sha256(b"".join(p.read_bytes() for p in files)).hexdigest()
    assert meta["source_bytes"] == sum(p.stat().st_size for p in files)
    assert meta["tokenizer"]["kind"] == "bpe" and meta["eot_id"] == 0 and meta["documents"] == len(files)
    assert meta["created"].endswith("+00:00")
    # 10 % held out, give or take the document boundary it was cut at.
    assert 0.05 < len(val) / (len(train) + len(val)) < 0.15
    # The summary names the output and the exact training command (vocabulary rounded up to 128).
    assert f"to {out}" in r.stdout
    assert (f"ddp-run task=gpt data.path={out}/train.bin data.val_path={out}/val.bin task.model.vocab=1024"
            in r.stdout)


def test_tokens_decode_back_to_every_document_in_order(tokenized) -> None:
    from tokenizers import Tokenizer

    _, out, files, _ = tokenized
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    ids = np.concatenate([read_tokens(out / "train.bin"), read_tokens(out / "val.bin")])
    eot = load_json(out / "meta.json")["eot_id"]
    # One separator after each document, and only there: the literal "<|endoftext|>" in the notes is text.
    ends = np.flatnonzero(ids == eot)
    assert len(ends) == len(files) and ends[-1] == len(ids) - 1
    docs = np.split(ids, ends + 1)[:-1]
    for path, doc in zip(files, docs, strict=True):
        assert tok.decode(doc[:-1].tolist()) == path.read_text(encoding="utf-8"), path.name


def test_split_falls_on_a_document_boundary(tokenized) -> None:
    _, out, _, _ = tokenized
    meta = load_json(out / "meta.json")
    assert meta["split"]["method"] == "documents" and meta["split"]["val_documents"] >= 1
    assert read_tokens(out / "train.bin")[-1] == meta["eot_id"]  # train ends with a whole document


def test_existing_tokenizer_file_gives_the_same_ids(tokenized, tmp_path: Path) -> None:
    corpus, out, _, _ = tokenized
    assert tokenize.main([str(corpus), "--out", str(tmp_path / "again"), "--tokenizer",
                          str(out / "tokenizer.json"), "--quiet"]) == 0
    for name in ("train.bin", "val.bin"):
        assert (tmp_path / "again" / name).read_bytes() == (out / name).read_bytes()
    meta = load_json(tmp_path / "again" / "meta.json")
    assert meta["tokenizer"]["kind"] == "file" and meta["vocab_size"] == 1000


def test_single_file_tail_split_glob_and_default_out(tmp_path: Path) -> None:
    text = tmp_path / "book.rst"
    text.write_bytes((STDLIB / "textwrap.py").read_bytes())
    r = tokenize_cli(str(text), "--val-fraction", "0.2", "--vocab-size", "600", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = tmp_path / "book-tokens"  # default: derived from the input's name, in the current folder
    meta = load_json(out / "meta.json")
    assert meta["split"]["method"] == "tail"  # one document: cut inside it
    n = meta["tokens"]["train"] + meta["tokens"]["val"]
    assert meta["tokens"]["val"] == int(n * 0.2)
    # A folder takes only what --glob names.
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.rst").write_text("alpha beta\n" * 200)
    (tmp_path / "docs" / "b.txt").write_text("gamma\n" * 200)
    assert tokenize.main([str(tmp_path / "docs"), "--glob", "*.rst", "--out", str(tmp_path / "o"),
                          "--vocab-size", "300", "--quiet"]) == 0
    assert load_json(tmp_path / "o" / "meta.json")["source_files"] == 1


def test_gpt2_without_network_fails_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("hello\n")
    # HF_HUB_OFFLINE: fail at once instead of retrying an unreachable host (what no network does, slowly).
    r = tokenize_cli(str(tmp_path / "a.txt"), "--tokenizer", "gpt2", "--out", str(tmp_path / "o"),
                     env={"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")})
    assert r.returncode == 2, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("ddp-tokenize: error: --tokenizer=gpt2: ") and "--tokenizer bpe" in last
    assert "Traceback" not in r.stderr


def test_help_names_every_option() -> None:
    r = tokenize_cli("--help")
    assert r.returncode == 0
    for opt in ("--out", "--glob", "--tokenizer", "--vocab-size", "--val-fraction", "--train-bytes", "ddp-run"):
        assert opt in r.stdout


def test_too_small_model_vocab_is_refused_before_launch(tokenized, tmp_path: Path, cli) -> None:
    """Through the CLI's main() in this process (the run on its output: tests/e2e/test_tokenize_e2e.py)."""
    _, out, _, _ = tokenized
    r = cli(["task=gpt", "device=cpu", f"data.path={out}/train.bin", f"data.val_path={out}/val.bin",
             "task.model.vocab=512"], tmp_path / "runs")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "task.model.vocab" in r.stderr and "1000" in r.stderr and "1024" in r.stderr  # need, and the fix
    assert not (tmp_path / "runs").exists()
