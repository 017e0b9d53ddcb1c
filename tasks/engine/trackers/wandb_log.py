"""Weights & Biases: rank 0 runs ``wandb.init`` with the id, group and directory the driver chose (run.json
``trackers.wandb``). Offline by default: files under ``<run>/wandb``, never a network call; ``wandb sync`` uploads
them later. A continued run reuses the id (``resume="allow"``)."""

from __future__ import annotations

from typing import Any


class WandbLog:
    """The W&B tracker."""

    name = "wandb"

    def __init__(self, record: dict[str, Any], config: dict[str, str], run_name: str) -> None:
        import wandb

        self.run = wandb.init(project=record["project"], entity=record.get("entity"), id=record["id"],
                              group=record.get("group"), dir=record["dir"], mode=record["mode"], name=run_name,
                              config=config, resume="allow", settings=wandb.Settings(console="off",
                                                                                     x_disable_stats=True))

    def log(self, scalars: dict[str, float], step: int) -> None:
        self.run.log(scalars, step=step)

    def resume_at(self, step: int) -> None:
        pass

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.run.finish()
