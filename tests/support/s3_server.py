"""Pytest fixtures: a real S3-compatible server (moto in server mode) on loopback.

``s3_server`` (session-scoped) starts ``python -m moto.server`` on a free 127.0.0.1 port in a subprocess,
waits until it answers, creates a bucket, and points plain ``s3://`` fsspec URLs at it through the
environment (fake credentials, ``AWS_ENDPOINT_URL``, ``FSSPEC_S3_ENDPOINT_URL``, region), which subprocesses
inherit too. It yields ``s3://<bucket>`` and kills the server at the end. ``s3_url`` (per test) yields a fresh
prefix under the bucket and drops s3fs's cached filesystem instances so that no test sees stale listings.

Skips only when moto/s3fs are not installed. tests/conftest.py imports both fixtures, so every test module can
ask for them by name. Also: helpers that read a run tree back from the bucket (``only_remote_run``, ``read_json``,
``files``).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator

import pytest

from tests.support.ports import free_port

BUCKET = "ddp-runner-test"


def _wait_until_up(proc: subprocess.Popen, endpoint: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"moto server exited early with code {proc.returncode}")
        try:
            with urllib.request.urlopen(endpoint + "/", timeout=1):  # noqa: S310 - loopback only
                return
        except urllib.error.HTTPError:
            return  # it answered, even if with an error status
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"moto server at {endpoint} did not answer within {timeout:.0f}s")


def _clear_s3fs_cache() -> None:
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()


@pytest.fixture(scope="session")
def s3_server() -> Iterator[str]:
    """A moto S3 server on 127.0.0.1 with one bucket; yields ``s3://<bucket>``."""
    for mod in ("moto", "s3fs", "flask"):
        if importlib.util.find_spec(mod) is None:
            pytest.skip(f"{mod} is not installed (install moto[server] and s3fs for the S3 tests)")
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    env = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ENDPOINT_URL_S3": endpoint,
        "FSSPEC_S3_ENDPOINT_URL": endpoint,  # read by fsspec at import: reaches subprocesses
    }
    try:
        _wait_until_up(proc, endpoint)
        with pytest.MonkeyPatch.context() as mp:
            for k, v in env.items():
                mp.setenv(k, v)
            mp.delenv("AWS_PROFILE", raising=False)
            import fsspec.config

            # This process imported fsspec already, so FSSPEC_S3_ENDPOINT_URL alone would not reach it here.
            s3_conf = {**fsspec.config.conf.get("s3", {}), "endpoint_url": endpoint}
            mp.setitem(fsspec.config.conf, "s3", s3_conf)
            _clear_s3fs_cache()
            import fsspec as _fsspec

            _fsspec.filesystem("s3").mkdir(BUCKET)
            yield f"s3://{BUCKET}"
            _clear_s3fs_cache()
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def s3_url(s3_server: str) -> Iterator[str]:
    """A fresh ``s3://<bucket>/<unique prefix>`` on the session's server; s3fs instance cache cleared."""
    _clear_s3fs_cache()
    yield f"{s3_server}/{uuid.uuid4().hex[:12]}"
    _clear_s3fs_cache()


# -- reading a run tree back from the bucket ------------------------------------------------------------------------


def s3():
    """The s3 filesystem with its listings cache dropped (what another process wrote is seen)."""
    import fsspec

    fs = fsspec.filesystem("s3")
    fs.invalidate_cache()
    return fs


def only_remote_run(root: str) -> str:
    """``s3://…`` URL of the one run directory under an S3 output root."""
    fs = s3()
    runs = [p.rsplit("/", 1)[0] for p in fs.glob(root.removeprefix("s3://") + "/*/*/config.yaml")]
    assert len(runs) == 1, runs
    return "s3://" + runs[0]


def read_json(url: str) -> dict:
    return json.loads(s3().cat_file(url))


def files(url: str) -> set[str]:
    base = url.removeprefix("s3://")
    return {p[len(base) + 1:] for p in s3().find(base)}
