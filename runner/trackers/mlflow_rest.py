"""The driver's few MLflow calls (open a job's run, reopen it, close it) as plain HTTP requests to a tracking
server's REST API, so that the driver need not import MLflow (several CPU-seconds per launch) for an ``http(s)://``
tracking URI. Other stores (SQLite, a folder, Databricks) go through MLflow's own client (:func:`client`).

Authentication as MLflow's client reads it from the environment: ``MLFLOW_TRACKING_TOKEN`` (bearer), else
``MLFLOW_TRACKING_USERNAME``/``MLFLOW_TRACKING_PASSWORD`` or credentials in the URI (basic);
``MLFLOW_TRACKING_INSECURE_TLS=true`` skips certificate checks and ``MLFLOW_TRACKING_SERVER_CERT_PATH`` names a CA
bundle.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Protocol

from ddp_runner.contract import tracking

API = "api/2.0/mlflow"


class Tracker(Protocol):
    """What the driver asks of an MLflow store (:mod:`ddp_runner.trackers.runs`)."""

    def experiment(self, name: str) -> str: ...
    def sweep_parent(self, exp_id: str, sweep_dir: str, name: str) -> str: ...
    def create_run(self, exp_id: str, name: str, tags: dict[str, str]) -> str: ...
    def run(self, run_id: str) -> tuple[str, dict[str, str]]: ...
    def set_status(self, run_id: str, status: str, *, end: bool) -> None: ...
    def set_tag(self, run_id: str, key: str, value: str) -> None: ...
    def log_params(self, run_id: str, params: dict[str, str]) -> None: ...


class RestError(RuntimeError):
    """The server answered with an error (``code``: MLflow's error code, e.g. RESOURCE_DOES_NOT_EXIST)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"HTTP {status} {code}: {message}".strip())
        self.status, self.code = status, code


def is_http(uri: str) -> bool:
    """Whether ``uri`` is a tracking server this module talks to."""
    return urllib.parse.urlsplit(uri).scheme in ("http", "https")


class RestClient:
    """An MLflow tracking server's REST API, the calls :class:`Tracker` names."""

    def __init__(self, uri: str, timeout_s: float) -> None:
        parts = urllib.parse.urlsplit(uri)
        netloc = parts.hostname or ""
        if parts.port:
            netloc += f":{parts.port}"
        self.base = urllib.parse.urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))
        self.timeout_s = timeout_s
        self.headers = {"Content-Type": "application/json"}
        user = os.environ.get("MLFLOW_TRACKING_USERNAME") or urllib.parse.unquote(parts.username or "")
        password = os.environ.get("MLFLOW_TRACKING_PASSWORD") or urllib.parse.unquote(parts.password or "")
        if token := os.environ.get("MLFLOW_TRACKING_TOKEN"):
            self.headers["Authorization"] = f"Bearer {token}"
        elif user:
            self.headers["Authorization"] = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        self.context: ssl.SSLContext | None = None
        if parts.scheme == "https":
            self.context = ssl.create_default_context(cafile=os.environ.get("MLFLOW_TRACKING_SERVER_CERT_PATH"))
            if os.environ.get("MLFLOW_TRACKING_INSECURE_TLS", "").lower() == "true":
                self.context.check_hostname, self.context.verify_mode = False, ssl.CERT_NONE

    def call(self, method: str, endpoint: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        """One request; the decoded JSON answer. RestError for an HTTP error, OSError when nothing answered."""
        url = f"{self.base}/{API}/{endpoint}"
        data = None
        if method == "GET" and body:
            url += "?" + urllib.parse.urlencode(body)
        elif body is not None:
            data = json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, headers=self.headers, method=method)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s, context=self.context) as r:  # noqa: S310
                raw = r.read()
        except urllib.error.HTTPError as exc:
            text = exc.read().decode(errors="replace")
            try:
                err = json.loads(text)
            except ValueError:
                err = {"message": text[:200]}
            raise RestError(exc.code, str(err.get("error_code", "")), str(err.get("message", ""))) from None
        return json.loads(raw) if raw.strip() else {}

    def reachable(self) -> None:
        """Raise unless the server answers a search for one experiment."""
        self.call("POST", "experiments/search", {"max_results": 1})

    def experiment(self, name: str) -> str:
        """The id of experiment ``name``, created when missing (another job may create it meanwhile)."""
        for attempt in range(2):
            try:
                return self.call("GET", "experiments/get-by-name", {"experiment_name": name})["experiment"][
                    "experiment_id"]
            except RestError as exc:
                if exc.code != "RESOURCE_DOES_NOT_EXIST" or attempt:
                    raise
            try:
                return self.call("POST", "experiments/create", {"name": name})["experiment_id"]
            except RestError as exc:
                if exc.code != "RESOURCE_ALREADY_EXISTS":
                    raise
        raise AssertionError("unreachable")

    def sweep_parent(self, exp_id: str, sweep_dir: str, name: str) -> str:
        """The parent run of the sweep in ``sweep_dir`` (its first job creates it)."""
        found = self.call("POST", "runs/search", {
            "experiment_ids": [exp_id], "max_results": 1,
            "filter": f"tags.`{tracking.TAG_SWEEP}` = '{sweep_dir}'"}).get("runs") or []
        if found:
            return found[0]["info"]["run_id"]
        return self.create_run(exp_id, name, {tracking.TAG_SWEEP: sweep_dir})

    def create_run(self, exp_id: str, name: str, tags: dict[str, str]) -> str:
        """A new RUNNING run; its id."""
        body = {"experiment_id": exp_id, "run_name": name, "start_time": int(time.time() * 1000),
                "tags": [{"key": k, "value": v} for k, v in tags.items()]}
        return self.call("POST", "runs/create", body)["run"]["info"]["run_id"]

    def run(self, run_id: str) -> tuple[str, dict[str, str]]:
        """A run's status and parameters."""
        run = self.call("GET", "runs/get", {"run_id": run_id})["run"]
        params = {p["key"]: p["value"] for p in (run.get("data") or {}).get("params") or []}
        return run["info"]["status"], params

    def set_status(self, run_id: str, status: str, *, end: bool) -> None:
        """Set a run's status (``end``: and its end time, as ``set_terminated`` does)."""
        body: dict[str, Any] = {"run_id": run_id, "status": status}
        if end:
            body["end_time"] = int(time.time() * 1000)
        self.call("POST", "runs/update", body)

    def set_tag(self, run_id: str, key: str, value: str) -> None:
        """One tag on a run."""
        self.call("POST", "runs/set-tag", {"run_id": run_id, "key": key, "value": value})

    def log_params(self, run_id: str, params: dict[str, str]) -> None:
        """Parameters, in batches of MLflow's limit."""
        items = [{"key": k, "value": str(v)} for k, v in params.items()]
        for i in range(0, len(items), PARAMS_PER_CALL):
            self.call("POST", "runs/log-batch", {"run_id": run_id, "params": items[i:i + PARAMS_PER_CALL]})


PARAMS_PER_CALL = 100  # MLflow's limit of parameters in one log-batch


class MlflowStore:
    """The same calls through MLflow's own client, for stores that are not a tracking server."""

    def __init__(self, uri: str) -> None:
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(uri)

    def experiment(self, name: str) -> str:
        """The id of experiment ``name``, created when missing (another job may create it meanwhile)."""
        found = self.client.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        try:
            return self.client.create_experiment(name)
        except Exception:
            found = self.client.get_experiment_by_name(name)
            if found is None:
                raise
            return found.experiment_id

    def sweep_parent(self, exp_id: str, sweep_dir: str, name: str) -> str:
        """The parent run of the sweep in ``sweep_dir`` (its first job creates it)."""
        found = self.client.search_runs([exp_id], filter_string=f"tags.`{tracking.TAG_SWEEP}` = '{sweep_dir}'",
                                        max_results=1)
        if found:
            return found[0].info.run_id
        return self.create_run(exp_id, name, {tracking.TAG_SWEEP: sweep_dir})

    def create_run(self, exp_id: str, name: str, tags: dict[str, str]) -> str:
        """A new RUNNING run; its id."""
        return self.client.create_run(exp_id, run_name=name, tags=tags).info.run_id

    def run(self, run_id: str) -> tuple[str, dict[str, str]]:
        """A run's status and parameters."""
        run = self.client.get_run(run_id)
        return run.info.status, dict(run.data.params)

    def set_status(self, run_id: str, status: str, *, end: bool) -> None:
        """Set a run's status (``end``: and its end time)."""
        if end:
            self.client.set_terminated(run_id, status=status)
        else:
            self.client.update_run(run_id, status=status)

    def set_tag(self, run_id: str, key: str, value: str) -> None:
        """One tag on a run."""
        self.client.set_tag(run_id, key, value)

    def log_params(self, run_id: str, params: dict[str, str]) -> None:
        """Parameters, in batches of MLflow's limit."""
        from mlflow.entities import Param

        items = [Param(k, str(v)) for k, v in params.items()]
        for i in range(0, len(items), PARAMS_PER_CALL):
            self.client.log_batch(run_id, params=items[i:i + PARAMS_PER_CALL])


def client(uri: str, timeout_s: float) -> Tracker:
    """The store behind ``uri``: a tracking server over plain HTTP, anything else through MLflow."""
    return RestClient(uri, timeout_s) if is_http(uri) else MlflowStore(uri)
