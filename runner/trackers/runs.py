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
from ddp_runner.trackers.preflight import mlflow_uri, quick_requests, why

# MLflow's run status by the job's run.json status.
MLFLOW_STATUS = {layout.STATUS_COMPLETED: "FINISHED", layout.STATUS_FAILED: "FAILED",
                 layout.STATUS_INTERRUPTED: "KILLED", layout.STATUS_PREEMPTED: "KILLED"}
PARAMS_PER_CALL = 100  # MLflow's limit of parameters in one log_batch


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
    from mlflow.entities import Param
    from mlflow.tracking import MlflowClient

    uri = mlflow_uri(conf)
    client = MlflowClient(uri)
    wanted = tracking.params(conf, plan)
    try:
        with quick_requests():
            if previous is not None:  # a continued run goes on in its own tracker run
                run_id = previous["run_id"]
                run = client.get_run(run_id)
                client.update_run(run_id, status="RUNNING")
                have = run.data.params
                changed = {k: v for k, v in wanted.items() if k in have and have[k] != v}
                wanted = {k: v for k, v in wanted.items() if k not in have}
                for k, v in changed.items():  # a parameter cannot change: the new value goes in as a tag
                    client.set_tag(run_id, f"continued.{k}", v)
                record = dict(previous)
            else:
                exp_id = _experiment(client, (conf["logger"][tracking.MLFLOW] or {}).get("experiment")
                                     or conf["task"]["name"])
                tags = {tracking.TAG_RUN_DIR: run_url}
                parent = _sweep_parent(client, exp_id, sweep_dir) if sweep_dir else None
                if parent is not None:
                    tags["mlflow.parentRunId"] = parent
                run_id = client.create_run(exp_id, run_name=_name(run_url), tags=tags).info.run_id
                record = {"tracking_uri": tracking.redact_uri(uri), "experiment_id": exp_id, "run_id": run_id,
                          "parent_run_id": parent}
            items = [Param(k, v) for k, v in wanted.items()]
            for i in range(0, len(items), PARAMS_PER_CALL):
                client.log_batch(run_id, params=items[i:i + PARAMS_PER_CALL])
    except Exception as exc:  # noqa: BLE001 - the server refused or went away since the preflight check
        raise PlanError("logger.mlflow", tracking.redact_uri(uri),
                        f"the MLflow run could not be opened ({why(exc, uri)})",
                        "check the tracking server, or leave mlflow out of logger=[...]") from exc
    return record


def _experiment(client: Any, name: str) -> str:
    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    try:
        return client.create_experiment(name)
    except Exception:  # another job created it meanwhile
        found = client.get_experiment_by_name(name)
        if found is None:
            raise
        return found.experiment_id


def _sweep_parent(client: Any, exp_id: str, sweep_dir: str) -> str:
    """The parent run of the sweep in ``sweep_dir`` (its first job creates it)."""
    found = client.search_runs([exp_id], filter_string=f"tags.`{tracking.TAG_SWEEP}` = '{sweep_dir}'",
                               max_results=1)
    if found:
        return found[0].info.run_id
    return client.create_run(exp_id, run_name=_name(sweep_dir), tags={tracking.TAG_SWEEP: sweep_dir}).info.run_id


def finish(conf: dict[str, Any], record: dict[str, Any], status: str | None) -> str | None:
    """Close this job's tracker runs with its run.json ``status`` (a sweep's parent run too: FAILED once a job
    failed); returns a warning when the tracker could not be told (the run's own files are complete)."""
    ml = record.get(tracking.MLFLOW)
    if not ml:
        return None
    from mlflow.tracking import MlflowClient

    mstatus = MLFLOW_STATUS.get(status or "")
    if mstatus is None:  # still running or queued (a Slurm job): whoever ends it later says how
        return None
    try:
        with quick_requests():
            client = MlflowClient(tracking.mlflow_uri(conf) or ml["tracking_uri"])
            client.set_terminated(ml["run_id"], status=mstatus)
            if ml.get("parent_run_id"):
                parent = client.get_run(ml["parent_run_id"])
                failed = parent.info.status == "FAILED" or mstatus != "FINISHED"
                client.set_terminated(ml["parent_run_id"], status="FAILED" if failed else "FINISHED")
    except Exception as exc:  # noqa: BLE001 - the run is over either way; say it
        return f"the MLflow run {ml['run_id']} could not be closed ({why(exc, tracking.mlflow_uri(conf) or '')})"
    return None
