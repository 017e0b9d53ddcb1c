"""Before launch: every selected tracker is installed and can be reached, else a refusal (exit 2) that names the
logger and the fix; with ``logger.<name>.on_unreachable=warn`` an unreachable one is dropped with a warning and the
others go on. Nothing here runs for TensorBoard or CSV, which need neither."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

from ddp_runner.console import textfit
from ddp_runner.contract import tracking
from ddp_runner.contract.errors import PlanError

REACH_TIMEOUT_S = 10
WANDB_DEFAULT_BASE = "https://api.wandb.ai"


def check_installed(conf: dict[str, Any]) -> None:
    """Refuse a selected tracker whose package is not installed, naming the pip extra that installs it."""
    for name in tracking.selected(conf):
        module = tracking.MODULES.get(name)
        if module is not None and importlib.util.find_spec(module) is None:
            extra = tracking.EXTRAS[name]
            raise PlanError("logger", name, f"the {name} logger needs the {module} package, which is not installed",
                            f"pip install 'ddp-runner[{extra}]' (or leave {name} out of logger=[...])")


def mlflow_uri(conf: dict[str, Any]) -> str:
    """The tracking URI this job logs to (PlanError: the default local store under a remote output root)."""
    given = (conf["logger"].get(tracking.MLFLOW) or {}).get("tracking_uri")
    uri = tracking.mlflow_uri(conf)
    if uri is None:
        raise PlanError("logger.mlflow.tracking_uri", given, "the default local store cannot live under the remote"
                        f" output.root={conf['output']['root']!r}",
                        "set logger.mlflow.tracking_uri=http://<server>:5000 (or any MLflow tracking URI)")
    return uri


def why(exc: BaseException, uri: str) -> str:
    """An exception's type and first line, for a refusal (the URI's credentials left out)."""
    first = str(exc).splitlines()[0][:300] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {first.replace(uri, tracking.redact_uri(uri))}"


@contextlib.contextmanager
def quick_requests() -> Iterator[None]:
    """MLflow's HTTP calls in this block give up at once (no retries, a short timeout): a refusal before launch,
    not minutes of back-off. The workers keep MLflow's own defaults."""
    keys = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": str(REACH_TIMEOUT_S)}
    saved = {k: os.environ.get(k) for k in keys}
    os.environ.update({k: v for k, v in keys.items() if saved[k] is None})
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)


def _reach_mlflow(conf: dict[str, Any]) -> str | None:
    """Why the MLflow tracking server cannot be reached (None: it answered)."""
    uri = mlflow_uri(conf)
    # MLflow's own usage telemetry posts to the internet from a thread: off unless the user set it (their env wins)
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    from ddp_runner.trackers import mlflow_rest

    with quick_requests():
        try:
            if mlflow_rest.is_http(uri):  # a plain request: importing MLflow costs the driver seconds
                mlflow_rest.RestClient(uri, REACH_TIMEOUT_S).reachable()
            else:
                from mlflow.tracking import MlflowClient

                MlflowClient(uri).search_experiments(max_results=1)
        except Exception as exc:  # noqa: BLE001 - any failure to answer is the refusal's reason
            return f"{tracking.redact_uri(uri)}: {why(exc, uri)}"
    return None


def _reach_wandb(conf: dict[str, Any]) -> str | None:
    """Why the W&B server cannot be reached (None: it answered, or offline mode, which needs no server)."""
    if (conf["logger"].get(tracking.WANDB) or {}).get("mode", "offline") != "online":
        return None
    base = os.environ.get("WANDB_BASE_URL", WANDB_DEFAULT_BASE)
    try:
        with urllib.request.urlopen(base, timeout=REACH_TIMEOUT_S):  # noqa: S310 - the user's own W&B server
            return None
    except urllib.error.HTTPError:
        return None  # it answered
    except OSError as exc:
        return f"{base}: {exc}"


def check_reachable(conf: dict[str, Any]) -> list[str]:
    """Refuse (PlanError) a selected tracker that cannot be reached, or drop it from ``conf['logger']`` when its
    ``on_unreachable`` is ``warn``; returns the warnings to print."""
    warnings = []
    for name, probe in ((tracking.MLFLOW, _reach_mlflow), (tracking.WANDB, _reach_wandb)):
        if name not in tracking.selected(conf):
            continue
        why = probe(conf)
        if why is None:
            continue
        settings = conf["logger"][name] or {}
        if settings.get("on_unreachable", "refuse") == "warn":
            del conf["logger"][name]
            warnings.append(f"logger {name} cannot be reached ({why}); going on without it"
                            f" (logger.{name}.on_unreachable=warn)")
            continue
        raise PlanError(f"logger.{name}", name, f"the tracker cannot be reached ({why})",
                        f"start it or fix its address, leave {name} out of logger=[...], or set"
                        f" logger.{name}.on_unreachable=warn to go on without it")
    return warnings


def preflight(conf: dict[str, Any]) -> None:
    """Everything above, before a launch; warnings go to stderr."""
    check_installed(conf)
    for line in check_reachable(conf):
        textfit.say(f"ddp-run: warning: {line}", sys.stderr, flush=True)
