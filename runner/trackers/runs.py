"""One tracker run per job, opened by the driver before launch and recorded in run.json (``trackers``).

- MLflow: the run is created here (its experiment: ``logger.mlflow.experiment``, else the task's name), with the
  resolved config and the plan as parameters (:func:`ddp_runner.contract.tracking.params`) and the run directory as
  a tag. A sweep's jobs are children of one parent run per sweep directory (``mlflow.parentRunId``). A continued run
  (``resume=<run dir>``, ``resume=last``) reopens the run its run.json names: no second run. The driver closes it
  with the job's status. Rank 0 logs metrics into it.
- W&B: an id and group chosen here (the group: the sweep directory's name), so a continued run goes on under the
  same id; rank 0 runs ``wandb.init`` with them.
- TensorBoard and CSV: where their files are.
"""

from __future__ import annotations

import posixpath
import secrets
import string
from typing import Any

from ddp_runner.contract import layout, tracking
from ddp_runner.contract.errors import PlanError
from ddp_runner.trackers import mlflow_rest
from ddp_runner.trackers.preflight import REACH_TIMEOUT_S, mlflow_uri, quick_requests, why

# MLflow's run status by the job's run.json status.
MLFLOW_STATUS = {layout.STATUS_COMPLETED: "FINISHED", layout.STATUS_FAILED: "FAILED",
                 layout.STATUS_INTERRUPTED: "KILLED", layout.STATUS_PREEMPTED: "KILLED",
                 layout.STATUS_PRUNED: "KILLED"}  # a search's pruner stopped it early (MLflow has no "pruned")


def _name(url: str) -> str:
    return posixpath.basename(url.rstrip("/"))


def plan_params(plan: Any) -> dict[str, Any]:
    """The plan as tracker parameters: the global batch, its factors and the sentence that explains it."""
    return {"world_size": plan.world_size, "per_rank_batch": plan.per_rank_batch, "accumulation": plan.accumulation,
            "global_batch": plan.global_batch, "explanation": plan.explanation}


def open_runs(conf: dict[str, Any], plan: dict[str, Any], run_url: str, sweep_dir: str | None,
              previous: dict[str, Any] | None) -> dict[str, Any]:
    """Open (or, for a continued run, reopen: ``previous`` is its run.json ``trackers``) this job's tracker runs;
    returns what run.json records under ``trackers``. PlanError when a tracker refuses."""
    previous = previous or {}
    out: dict[str, Any] = {}
    for name in tracking.selected(conf):
        if name == tracking.TENSORBOARD:
            out[name] = {"dir": layout.TB}
        elif name == tracking.CSV:
            out[name] = {"path": tracking.METRICS_CSV}
        elif name == tracking.MLFLOW:
            out[name] = _open_mlflow(conf, plan, run_url, sweep_dir, previous.get(name))
        elif name == tracking.WANDB:
            w = conf["logger"][name] or {}
            out[name] = previous.get(name) or {
                "id": "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8)),
                "project": w.get("project") or "ddp-runner", "entity": w.get("entity"),
                "group": _name(sweep_dir) if sweep_dir else None, "mode": w.get("mode") or "offline",
                "dir": tracking.WANDB_DIR}
    return out


def _open_mlflow(conf: dict[str, Any], plan: dict[str, Any], run_url: str, sweep_dir: str | None,
                 previous: dict[str, Any] | None) -> dict[str, Any]:
    uri = mlflow_uri(conf)
    wanted = tracking.params(conf, plan)
    try:
        with quick_requests():
            store = mlflow_rest.client(uri, REACH_TIMEOUT_S)
            if previous is not None:  # a continued run goes on in its own tracker run
                run_id = previous["run_id"]
                _status, have = store.run(run_id)
                store.set_status(run_id, "RUNNING", end=False)
                changed = {k: v for k, v in wanted.items() if k in have and have[k] != v}
                wanted = {k: v for k, v in wanted.items() if k not in have}
                for k, v in changed.items():  # a parameter cannot change: the new value goes in as a tag
                    store.set_tag(run_id, f"continued.{k}", v)
                record = dict(previous)
            else:
                exp_id = store.experiment((conf["logger"][tracking.MLFLOW] or {}).get("experiment")
                                          or conf["task"]["name"])
                tags = {tracking.TAG_RUN_DIR: run_url}
                parent = store.sweep_parent(exp_id, sweep_dir, _name(sweep_dir)) if sweep_dir else None
                if parent is not None:
                    tags["mlflow.parentRunId"] = parent
                run_id = store.create_run(exp_id, _name(run_url), tags)
                record = {"tracking_uri": tracking.redact_uri(uri), "experiment_id": exp_id, "run_id": run_id,
                          "parent_run_id": parent}
            store.log_params(run_id, wanted)
    except Exception as exc:  # noqa: BLE001 - the server refused or went away since the preflight check
        raise PlanError("logger.mlflow", tracking.redact_uri(uri),
                        f"the MLflow run could not be opened ({why(exc, uri)})",
                        "check the tracking server, or leave mlflow out of logger=[...]") from exc
    return record


def finish(conf: dict[str, Any], record: dict[str, Any], status: str | None) -> str | None:
    """Close this job's tracker runs with its run.json ``status`` (a sweep's parent run too: FAILED once a job
    failed); returns a warning when the tracker could not be told (the run's own files are complete)."""
    ml = record.get(tracking.MLFLOW)
    if not ml:
        return None
    mstatus = MLFLOW_STATUS.get(status or "")
    if mstatus is None:  # still running or queued (a Slurm job): whoever ends it later says how
        return None
    try:
        with quick_requests():
            store = mlflow_rest.client(tracking.mlflow_uri(conf) or ml["tracking_uri"], REACH_TIMEOUT_S)
            store.set_status(ml["run_id"], mstatus, end=True)
            if ml.get("parent_run_id"):
                parent_status, _ = store.run(ml["parent_run_id"])
                # a pruned trial ended as its search meant it to: the sweep did not fail
                failed = parent_status == "FAILED" or (mstatus != "FINISHED" and status != layout.STATUS_PRUNED)
                store.set_status(ml["parent_run_id"], "FAILED" if failed else "FINISHED", end=True)
    except Exception as exc:  # noqa: BLE001 - the run is over either way; say it
        return f"the MLflow run {ml['run_id']} could not be closed ({why(exc, tracking.mlflow_uri(conf) or '')})"
    return None
