"""MLflow: rank 0 logs into the run the driver opened for this job (run.json ``trackers.mlflow``).

The driver created the run (one per job, whatever the world size, node count or number of launches), logged the
parameters and closes it with the job's status; this side only logs metrics, one ``log_batch`` per log step, from a
background thread (base.Background). A continued run logs into the same run: a step that run already holds (an
interrupted attempt logged it after the checkpoint this launch resumed from) is not logged twice.
"""

from __future__ import annotations

import time
from typing import Any

# MLflow's limit of metrics in one log_batch call.
BATCH_MAX = 1000


class MlflowLog:
    """The MLflow tracker."""

    name = "mlflow"

    def __init__(self, tracking_uri: str, run_id: str) -> None:
        import os

        # No usage telemetry from rank 0 (MLflow posts it to the internet from a thread), unless the user asked.
        os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
        from mlflow.tracking import MlflowClient

        self.client, self.run_id = MlflowClient(tracking_uri), run_id
        # The last step the run holds for each metric: points at or before it were logged by an earlier attempt.
        self.logged = last_steps(self.client, run_id)

    def log(self, scalars: dict[str, float], step: int) -> None:
        self.log_many([(scalars, step)])

    def log_many(self, points: list[tuple[dict[str, float], int]]) -> None:
        """Several log steps' scalars in as few requests as MLflow's batch limit allows."""
        from mlflow.entities import Metric

        ms = int(time.time() * 1000)
        metrics = [Metric(k, float(v), ms, step) for scalars, step in points for k, v in scalars.items()
                   if step > self.logged.get(k, -1)]
        for i in range(0, len(metrics), BATCH_MAX):
            self.client.log_batch(self.run_id, metrics=metrics[i:i + BATCH_MAX], synchronous=True)

    def resume_at(self, step: int) -> None:
        pass  # points already logged are skipped by step (see log)

    def flush(self) -> None:
        pass  # every call above returned once the server had it

    def close(self) -> None:
        pass  # the driver ends the run with the job's status


def last_steps(client: Any, run_id: str) -> dict[str, int]:
    """The last step the run holds for each metric: the run's latest metrics carry their step (``runs/get``); read
    from each metric's history where this MLflow's client does not expose them."""
    data = client.get_run(run_id).data
    objs = getattr(data, "_metric_objs", None)
    if objs is not None:
        return {m.key: m.step for m in objs}
    return {k: max((m.step for m in client.get_metric_history(run_id, k)), default=-1) for k in data.metrics}
