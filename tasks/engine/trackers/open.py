"""Rank 0 opens the loggers its config selects (``logger`` group), with what the driver recorded for each in
run.json (``trackers``): the MLflow run, the W&B id and group. Run in a thread at start-up: the imports overlap the
process-group and model set-up."""

from __future__ import annotations

import os
from typing import IO, Any

from ddp_runner.contract import layout, tracking
from ddp_runner.contract.rules import explain
from ddp_runner.tasks.engine.config import Config, auto_micro_batch, batch_plan, read_manifest
from ddp_runner.tasks.engine.trackers.base import Background, Trackers


def recorded(run_dir: str) -> dict[str, Any]:
    """The trackers the driver opened for the run at ``run_dir`` (run.json), or {} when it records none."""
    return read_manifest(run_dir).get(tracking.MANIFEST_TRACKERS) or {}


def open_trackers(cfg: Config, run_dir: str, local_dir: str, console: IO[str] | None = None) -> Trackers:
    """Every selected logger, opened (one that the driver did not open, e.g. dropped with on_unreachable=warn, is
    left out). A logger that fails to open is reported and left out, like one that fails later."""
    names = tracking.selected(cfg)
    record = recorded(run_dir) if set(names) & {tracking.MLFLOW, tracking.WANDB} else {}
    out = Trackers([], console)
    for name in names:
        try:
            tracker = _open(name, cfg, run_dir, local_dir, record)
        except Exception as exc:  # noqa: BLE001 - reported like a mid-run failure, the others go on
            out.trackers.append(_Failed(name))
            out._drop(out.trackers[-1], exc)
            continue
        if tracker is not None:
            out.trackers.append(tracker)
    return out


def _open(name: str, cfg: Config, run_dir: str, local_dir: str, record: dict[str, Any]) -> Any:
    if name == tracking.TENSORBOARD:
        from ddp_runner.tasks.engine.trackers.tensorboard import TensorBoard

        return TensorBoard(os.path.join(local_dir, layout.TB))
    if name == tracking.CSV:
        from ddp_runner.tasks.engine.trackers.csv_log import CsvLog

        return CsvLog(os.path.join(local_dir, tracking.METRICS_CSV))
    if name not in record:  # the driver went on without it (logger.<name>.on_unreachable=warn)
        return None
    if name == tracking.MLFLOW:
        from ddp_runner.tasks.engine.trackers.mlflow_log import MlflowLog

        # The URI from the config (run.json holds it without credentials), resolved as the driver did.
        return Background(MlflowLog(tracking.mlflow_uri(cfg) or record[name]["tracking_uri"], record[name]["run_id"]))
    from ddp_runner.tasks.engine.trackers.wandb_log import WandbLog

    bp = batch_plan(cfg, int(os.environ.get("WORLD_SIZE", "1")), _start_micro_batch(cfg, run_dir))
    plan = {**bp.as_dict(), "explanation": explain(bp.global_batch, bp.per_rank, bp.world_size, bp.accumulation)}
    wrec = {**record[name], "dir": os.path.join(local_dir)}
    return Background(WandbLog(wrec, tracking.params(cfg, plan), run_dir.rstrip("/").rsplit("/", 1)[-1]))


def _start_micro_batch(cfg: Config, run_dir: str) -> int | None:
    """``batch.per_rank=auto``: the micro-batch the driver chose to start at (run.json), so that the plan among the
    parameters is the one the driver's trackers record, not the whole share; the size the ranks settle on is the
    metric ``batch/micro``. None: a given micro-batch."""
    if not auto_micro_batch(cfg):
        return None
    return ((read_manifest(run_dir).get("plan") or {}).get("micro_batch") or {}).get("start")


class _Failed:
    """Stands for a logger that could not be opened, so that it is reported like any failure."""

    def __init__(self, name: str) -> None:
        self.name = name
