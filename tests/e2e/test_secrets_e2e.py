"""No secret on disk (issue 30): a password typed into a URL and one taken from the environment (``${oc.env:…}``)
appear in no file of the run tree and not on the console, while the workers still read the data with them (the
server below refuses any other credentials), and a continued run takes the environment's value again."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.support.run_tree import run_dirs

ENV_PASSWORD = "envpass-7d1e0c"
URL_PASSWORD = "urlpass-93b2aa"
ACCEPTED = {f"reader:{ENV_PASSWORD}", f"validator:{URL_PASSWORD}"}


def _server(text: bytes) -> ThreadingHTTPServer:
    """An HTTP server of one file that demands Basic credentials and honours range requests (fsspec's reads)."""

    class Handler(BaseHTTPRequestHandler):
        def _authorised(self) -> bool:
            auth = self.headers.get("Authorization", "")
            if not auth.startswith("Basic ") or base64.b64decode(auth[6:]).decode() not in ACCEPTED:
                self.send_response(401)
                self.end_headers()
                return False
            return True

        def _body(self) -> tuple[int, bytes, dict[str, str]]:
            rng = self.headers.get("Range")
            if rng and rng.startswith("bytes="):
                start, _, end = rng[6:].partition("-")
                a, b = int(start or 0), min(int(end) if end else len(text) - 1, len(text) - 1)
                return 206, text[a:b + 1], {"Content-Range": f"bytes {a}-{b}/{len(text)}"}
            return 200, text, {}

        def do_HEAD(self) -> None:  # noqa: N802 - http.server's name
            if self._authorised():
                self.send_response(200)
                self.send_header("Content-Length", str(len(text)))
                self.send_header("Accept-Ranges", "bytes")
                self.end_headers()

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if self._authorised():
                code, body, headers = self._body()
                self.send_response(code)
                for k, v in {**headers, "Content-Length": str(len(body)), "Accept-Ranges": "bytes"}.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    return ThreadingHTTPServer(("127.0.0.1", 0), Handler)


@pytest.fixture(scope="module")
def secret_run(tmp_path_factory: pytest.TempPathFactory, text_file: Path) -> Iterator[tuple[Path, str, str]]:
    """One completed tiny GPT run whose data and validation files come over HTTP with credentials."""
    server = _server(text_file.read_bytes())
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    root = tmp_path_factory.mktemp("secrets") / "outputs"
    args = ["task=gpt", "device=cpu", "world_size=1", "task.model.layers=1", "batch.per_rank=4", "train.max_steps=2",
            "train.epochs=null", "train.val_every=2", "checkpoint.every_steps=1",
            f"data.path=http://reader:${{oc.env:DDP_TEST_PASSWORD}}@127.0.0.1:{port}/small.txt",
            f"data.val_path=http://validator:{URL_PASSWORD}@127.0.0.1:{port}/small.txt", f"output.root={root}"]
    env = {**os.environ, "DDP_TEST_PASSWORD": ENV_PASSWORD}
    r = subprocess.run([sys.executable, "-m", "ddp_runner", *args], cwd=tempfile.gettempdir(), env=env,
                       capture_output=True, text=True, timeout=240)
    try:
        yield root, r.stdout + r.stderr, str(r.returncode)
    finally:
        server.shutdown()


def test_no_secret_in_any_file_or_on_the_console(secret_run: tuple[Path, str, str]) -> None:
    root, console, code = secret_run
    assert code == "0", console  # the workers read both files: they had the real credentials
    [run] = run_dirs(root)
    files = [p for p in root.rglob("*") if p.is_file()]
    assert len(files) > 8
    for p in files:
        data = p.read_bytes()
        for secret in (ENV_PASSWORD, URL_PASSWORD):
            assert secret.encode() not in data, f"{secret} in {p}"
    for secret in (ENV_PASSWORD, URL_PASSWORD):
        assert secret not in console
    config = (run / "config.yaml").read_text()
    assert "${oc.env:DDP_TEST_PASSWORD}" in config and "validator:***@" in config  # what a continuation needs


def test_continued_run_needs_its_masked_credentials(secret_run: tuple[Path, str, str], cli) -> None:
    """Continuing it (a dry run: nothing launched) resolves the environment's value again, and asks for the
    URL whose password was masked rather than running the workers with ``***``."""
    root, _, _ = secret_run
    [run] = run_dirs(root)
    env = {"DDP_TEST_PASSWORD": ENV_PASSWORD}
    r = cli([f"resume={run}", "train.max_steps=4", "dry_run=true"], root, env=env)
    assert r.returncode == 2 and "data.val_path" in r.stderr and "credentials masked" in r.stderr, r.stderr
    assert URL_PASSWORD not in r.stderr + r.stdout
    val = f"data.val_path=http://validator:{URL_PASSWORD}@127.0.0.1:2/small.txt"
    r = cli([f"resume={run}", "train.max_steps=4", "dry_run=true", "data=text", val], root, env=env)
    assert r.returncode == 2 and "credentials masked" in r.stderr  # another URL than the recorded one
    port = (run / "config.yaml").read_text().split("validator:***@127.0.0.1:", 1)[1].split("/", 1)[0]
    val = f"data.val_path=http://validator:{URL_PASSWORD}@127.0.0.1:{port}/small.txt"
    r = cli([f"resume={run}", "train.max_steps=4", "dry_run=true", "data=text", val], root, env=env)
    assert r.returncode == 0, r.stderr
    assert URL_PASSWORD not in r.stderr + r.stdout and ENV_PASSWORD not in r.stderr + r.stdout
