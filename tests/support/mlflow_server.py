"""Pytest fixture: a real MLflow tracking server on loopback, SQLite backend, once per test session.

``mlflow_server`` (session-scoped) starts ``mlflow server`` on a free 127.0.0.1 port with a SQLite store and
artifacts in a temporary folder, waits for ``/health``, and yields its URL. One server serves the whole session,
every xdist worker included: the first worker that asks starts it (a file lock; the others wait for it and read
its URL), so the tests that use it need not share a worker. It belongs to the session's controller process
(tests/support/owned_server.py): it ends when that process ends, or at once at the end of a session without
workers. ``MlflowRest`` queries it over its REST API, as any client would: runs of an experiment, a run's params
and a metric's history.

Skips only when mlflow is not installed (the test extra installs it).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.ports import free_port
from tests.support.shared_runs import shared_base


class MlflowRest:
    """The tracking server's REST API (``/api/2.0/mlflow/...``)."""

    def __init__(self, url: str) -> None:
        self.url = url

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"{self.url}/api/2.0/mlflow/{path}", data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:  # noqa: S310 - loopback only
            return json.loads(r.read() or b"{}")

    def experiment_id(self, name: str) -> str:
        q = urllib.parse.urlencode({"experiment_name": name})
        return self.call("GET", f"experiments/get-by-name?{q}")["experiment"]["experiment_id"]

    def runs(self, experiment_id: str, filter_string: str = "") -> list[dict[str, Any]]:
        """Every run of an experiment (deleted ones left out), each as the API returns it."""
        out: list[dict[str, Any]] = []
        token = None
        while True:
            body: dict[str, Any] = {"experiment_ids": [experiment_id], "filter": filter_string, "max_results": 1000}
            if token:
                body["page_token"] = token
            page = self.call("POST", "runs/search", body)
            out += page.get("runs", [])
            token = page.get("next_page_token")
            if not token:
                return out

    @staticmethod
    def params(run: dict[str, Any]) -> dict[str, str]:
        return {p["key"]: p["value"] for p in run["data"].get("params", [])}

    @staticmethod
    def tags(run: dict[str, Any]) -> dict[str, str]:
        return {t["key"]: t["value"] for t in run["data"].get("tags", [])}

    def history(self, run_id: str, key: str) -> list[dict[str, Any]]:
        """Every point of one metric of a run."""
        q = urllib.parse.urlencode({"run_id": run_id, "metric_key": key, "max_results": 25000})
        return self.call("GET", f"metrics/get-history?{q}").get("metrics", [])


def _wait_until_up(proc: subprocess.Popen, url: str, log: Path, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"mlflow server exited early with code {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=1):  # noqa: S310 - loopback only
                return
        except (OSError, urllib.error.URLError):
            time.sleep(0.2)
    raise RuntimeError(f"mlflow server at {url} did not answer within {timeout:.0f}s:\n{log.read_text()[-3000:]}")


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=5):  # noqa: S310 - loopback only
            return True
    except (OSError, urllib.error.URLError):
        return False


def _start(base: Path) -> dict[str, Any]:
    """Start a server owned by this session's controller (this process without xdist); wait until it answers."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = base / "server.log"
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    owner = os.getppid() if os.environ.get("PYTEST_XDIST_WORKER") else os.getpid()
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("owned_server.py")), str(owner),
             sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
             "--backend-store-uri", f"sqlite:///{base / 'mlflow.db'}", "--default-artifact-root", str(base / "art")],
            stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        _wait_until_up(proc, url, log)
    except BaseException:
        _stop(proc.pid)
        raise
    return {"url": url, "pid": proc.pid, "owner": owner}


def _stop(pid: int) -> None:
    """SIGTERM to the owned_server process: it stops the server and its workers."""
    import signal

    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.waitpid(pid, os.WNOHANG)  # this process's child: reap it (another's simply goes on)
        except ChildProcessError:
            pass
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real MLflow tracking server on 127.0.0.1 (SQLite backend), one for every worker of the session; yields
    its URL."""
    if importlib.util.find_spec("mlflow") is None:
        pytest.skip("mlflow is not installed (pip install 'ddp-runner[test]')")
    from filelock import FileLock

    base = shared_base(tmp_path_factory) / "mlflow"
    base.mkdir(parents=True, exist_ok=True)
    record = base / "server.json"
    with FileLock(str(record) + ".lock"):
        server = json.loads(record.read_text()) if record.exists() else None
        if server is None or not _answers(server["url"]):
            server = _start(base)
            record.write_text(json.dumps(server))
    try:
        yield server["url"]
    finally:
        if server["owner"] == os.getpid():  # no xdist: this process is the session; under xdist its controller
            _stop(server["pid"])
