"""Secrets on the console before launch (issue 30): a refusal, a backend's own error and a dry run never print a
URL's credentials or a value from the environment."""

from __future__ import annotations

from pathlib import Path


def test_a_backend_error_is_a_refusal_without_the_secret(tmp_path: Path, cli) -> None:
    r = cli(["task=gpt", "device=cpu", "data.path=s3://KEYID:secretzz@bucket/x.txt", "dry_run=true"], tmp_path,
            env={"AWS_EC2_METADATA_DISABLED": "true"})
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "data.path='s3://KEYID:***@bucket/x.txt': cannot be opened" in r.stderr
    assert "secretzz" not in r.stdout + r.stderr


def test_a_refused_value_from_the_environment_is_masked(tmp_path: Path, cli) -> None:
    r = cli(["task=smoke", "device=cpu", "train.lr=${oc.env:DDP_TEST_TOKEN}", "dry_run=true"], tmp_path,
            env={"DDP_TEST_TOKEN": "tok-5c7e01"})
    assert r.returncode == 2 and "refused: train.lr='***'" in r.stderr, r.stderr
    assert "tok-5c7e01" not in r.stdout + r.stderr


def test_a_refused_url_is_masked(tmp_path: Path, text_file: Path, cli) -> None:
    r = cli(["task=gpt", "device=cpu", f"data.path={text_file}", "dry_run=true",
             "data.val_path=http://me:pw-91ac@127.0.0.1:9/v.txt"], tmp_path)
    assert r.returncode == 2 and "http://me:***@127.0.0.1:9/v.txt" in r.stderr, r.stderr
    assert "pw-91ac" not in r.stdout + r.stderr
