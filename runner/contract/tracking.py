"""Trackers (the ``logger`` config group) as both sides name them: which exist, the extra that installs each, where
the driver records the runs it opened (run.json ``trackers``), and the one function that turns a job's config and
plan into tracker parameters (so that whatever must not leave the machine is removed in one place).

Standard library only: the driver and rank 0 import it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from ddp_runner.contract.rules import flatten

TENSORBOARD, CSV, MLFLOW, WANDB = "tensorboard", "csv", "mlflow", "wandb"
LOGGERS = (TENSORBOARD, CSV, MLFLOW, WANDB)
# The pip extra that installs each optional tracker, and the module that tells whether it is installed.
EXTRAS = {MLFLOW: "mlflow", WANDB: "wandb"}
MODULES = {MLFLOW: "mlflow", WANDB: "wandb"}
ON_UNREACHABLE = ("refuse", "warn")
WANDB_MODES = ("offline", "online")

# run.json: what the driver opened for this job, by logger: {"mlflow": {"tracking_uri", "experiment_id", "run_id",
# "parent_run_id"}, "wandb": {"id", "group", "project", "dir", "mode"}, "csv": {"path"}, "tensorboard": {"dir"}}.
MANIFEST_TRACKERS = "trackers"
METRICS_CSV = "metrics.csv"
WANDB_DIR = "wandb"
MLFLOW_DB = "mlflow.db"
# MLflow tags the driver sets: the run directory of a job, and a sweep's directory on the sweep's parent run.
TAG_RUN_DIR = "ddp_runner.run_dir"
TAG_SWEEP = "ddp_runner.sweep_dir"

# MLflow's limits (a parameter's value, and parameters per call).
PARAM_VALUE_MAX = 6000


def selected(conf: Mapping[str, Any]) -> list[str]:
    """The loggers a config selects, in the order of :data:`LOGGERS` (its ``logger`` mapping's keys)."""
    chosen = conf.get("logger") or {}
    return [name for name in LOGGERS if name in chosen]


def params(conf: Mapping[str, Any], plan: Mapping[str, Any]) -> dict[str, str]:
    """A job's tracker parameters: the plan (``plan.global_batch`` and how it is made) and the resolved config,
    flattened to dotted keys, values as text (lists as JSON). Every tracker's parameters come from here."""
    flat = {f"plan.{k}": v for k, v in plan.items()}
    flat.update(flatten({k: v for k, v in conf.items() if k not in ("hydra", "logger")}))
    out = {}
    for k, v in flat.items():
        text = json.dumps(v) if isinstance(v, (list, dict)) else str(v)
        out[k] = text[:PARAM_VALUE_MAX]
    return out


def mlflow_uri(conf: Mapping[str, Any]) -> str | None:
    """The tracking URI a job logs to: ``logger.mlflow.tracking_uri``, else :func:`default_mlflow_uri` (None: no
    default for a remote output root). The driver and rank 0 resolve it alike, so run.json need not hold it whole."""
    given = ((conf.get("logger") or {}).get(MLFLOW) or {}).get("tracking_uri")
    return given or default_mlflow_uri(str((conf.get("output") or {}).get("root", "outputs")))


def redact_uri(uri: str) -> str:
    """``uri`` without the credentials a URL may carry (``https://user:token@host`` -> ``https://***@host``), for
    run.json and messages."""
    scheme, sep, rest = uri.partition("://")
    if not sep or "@" not in rest.split("/", 1)[0]:
        return uri
    return f"{scheme}://***@{rest.split('@', 1)[1]}"


def default_mlflow_uri(root: str) -> str | None:
    """The tracking URI of ``logger.mlflow.tracking_uri=null``: ``$MLFLOW_TRACKING_URI`` when set, else a local
    SQLite store ``<output.root>/mlflow.db`` (None: a remote output root, which a local store cannot live under)."""
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    if root.startswith("file://"):
        root = root[len("file://"):]
    if "://" in root:
        return None
    return "sqlite:///" + os.path.join(os.path.abspath(os.path.expanduser(root)), MLFLOW_DB)

