"""Issue 30's pure rules: paths under output.root=/, task modules with no build(), no 'did you mean' across
depths, task.name never a path, the lease refusal's take-over rule, URL credentials, ddp-tokenize's binary and
undecodable input, keep_last=0 documented."""

from __future__ import annotations

import os
import shutil
import sys
from datetime import datetime
from pathlib import Path

import pytest

from ddp_runner.config import overrides, task_module, validate
from ddp_runner.contract import secrets
from ddp_runner.contract.errors import PlanError
from ddp_runner.data import tokenize
from ddp_runner.rundir import run_dir
from ddp_runner.rundir.lease import take, take_or_refuse

ROOT = Path(__file__).resolve().parents[2]


def test_output_root_slash_is_the_filesystem_root() -> None:
    assert run_dir._dated("/", datetime(2026, 12, 1)) == "/2026-12-01"
    from ddp_runner.launch import multinode

    conf = {"output": {"root": "/"}, "launcher": {"rdzv_id": "j1"}, "task": {"name": "smoke"}}
    assert multinode.run_url(conf, type("P", (), {"world_size": 2})()).startswith("/j1")


# torch._C: an extension module on any build of Python (the standard library's, such as math, are built in on some).
@pytest.mark.parametrize(("module", "kind"), [("os", "frozen module"), ("sys", "built-in module"),
                                              ("torch._C", "compiled module")])
def test_a_module_without_build_is_refused_whatever_its_kind(module: str, kind: str) -> None:
    with pytest.raises(PlanError, match=f"defines no build\\(\\): it is a {kind}"):
        task_module.locate(module)


def test_a_namespace_package_is_refused(tmp_path: Path) -> None:
    (tmp_path / "nsonly").mkdir()
    with pytest.raises(PlanError, match="namespace package"):
        task_module.locate("nsonly", cwd=str(tmp_path))


def test_no_suggestion_across_depths() -> None:
    keys = {"task.module", "task.name", "train.lr"}
    assert overrides._nearest("task.model.width", keys) is None
    assert overrides._nearest("train.lrr", keys) == "train.lr"


@pytest.mark.parametrize("name", ["x/../../../../esc", "..", ".hidden", "a\\b"])
def test_task_name_is_never_a_path(name: str) -> None:
    with pytest.raises(PlanError) as err:
        validate.check_task_name({"task": {"name": name}})
    assert err.value.key == "task.name" and "plain name" in err.value.problem
    validate.check_task_name({"task": {"name": "my-task_2"}})


def test_lease_refusal_says_when_a_lease_is_stale(tmp_path: Path) -> None:
    from fsspec.implementations.local import LocalFileSystem

    held = take(LocalFileSystem(), str(tmp_path))
    try:
        with pytest.raises(PlanError) as err:
            take_or_refuse(LocalFileSystem(), str(tmp_path), str(tmp_path))
        assert "60 s after its last heartbeat" in err.value.fix and "stale" in err.value.fix
    finally:
        held.release()


@pytest.mark.parametrize(("url", "masked"), [
    ("http://user:secretvalue@host/data.txt", "http://user:***@host/data.txt"),
    ("s3://KEY:secret@bucket/x", "s3://KEY:***@bucket/x"),
    ("simplecache::s3://KEY:secret@bucket/x", "simplecache::s3://KEY:***@bucket/x"),
    ("https://ghp_token@github.com/a/b", "https://***@github.com/a/b"),
    ("ddp-run data.path=ftp://u:p4ss@h/f val=gs://b/x", "ddp-run data.path=ftp://u:***@h/f val=gs://b/x"),
])
def test_url_credentials_are_masked(url: str, masked: str) -> None:
    assert secrets.redact_urls(url) == masked
    assert secrets.redact_urls(masked) == masked  # idempotent
    assert secrets.is_redacted(masked)


def test_oc_env_values_are_masked_everywhere_they_appear() -> None:
    conf = {"data": {"path": "http://u:${oc.env:P}@h/x", "token": "tok-123456"}, "train": {"lr": 0.1}}
    real = {"data": {"path": "http://u:pw-abc@h/x", "token": "tok-123456"}, "train": {"lr": 0.1}}
    env = {"data.token": "${oc.env:TOKEN}", "data.path": conf["data"]["path"]}
    assert secrets.secret_keys(real, env) == {"data.path": "http://u:pw-abc@h/x", "data.token": "tok-123456"}
    masks = secrets.secret_values(real, env)
    assert secrets.redact("token tok-123456 and pw-abc", masks) == "token *** and ***"


def test_tokenize_refuses_a_binary_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    binary = tmp_path / "prog"
    shutil.copy(sys.executable if os.path.getsize(sys.executable) < 50_000_000 else "/bin/ls", binary)
    assert tokenize.main([str(binary), "--out", str(tmp_path / "out"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "not text" in err and "Fix:" in err, err
    assert not (tmp_path / "out").exists()
    assert tokenize.binary_kind(b"abc\x00def") and tokenize.binary_kind("café\n".encode()) is None


def test_tokenize_counts_undecodable_bytes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    latin = tmp_path / "latin.txt"
    latin.write_bytes(b"hello caf\xe9 world, more text here\n" * 40)
    out = tmp_path / "out"
    assert tokenize.main([str(latin), "--out", str(out), "--quiet", "--vocab-size", "300", "--strict-utf8"]) == 2
    err = capsys.readouterr().err
    assert "holds 40 bytes that are not UTF-8" in err and not (out / "train.bin").exists()
    assert tokenize.main([str(latin), "--out", str(out), "--quiet", "--vocab-size", "300"]) == 0
    assert "warning: 40 bytes that are not UTF-8 were replaced by U+FFFD" in capsys.readouterr().err


def test_keep_last_zero_is_documented() -> None:
    assert "0 keeps all" in (ROOT / "conf/config.yaml").read_text()
    assert "0 keeps all" in (ROOT / "docs/checkpoints.md").read_text()


def test_workers_get_real_values_and_record_masked_ones(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """config.yaml holds the masked form; load_config merges the real values handed over in the environment;
    as_recorded (what trackers and records use) masks them again."""
    from ddp_runner.tasks.engine.config import as_recorded, load_config

    (tmp_path / "config.yaml").write_text("data:\n  path: http://u:***@h/x\n  token: ${oc.env:TOKEN}\n")
    real = {"data.path": "http://u:pw-abc@h/x", "data.token": "tok-123456"}
    monkeypatch.setenv(secrets.ENV_SECRETS, secrets.encode(real))
    cfg = load_config(str(tmp_path))
    assert cfg.data.path == "http://u:pw-abc@h/x" and cfg.data.token == "tok-123456"
    assert as_recorded(cfg) == {"data": {"path": "http://u:***@h/x", "token": "***"}}
