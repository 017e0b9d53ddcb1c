"""A task of the user's own (``task.module=wrong_forward``) whose model's ``forward`` takes one argument less than
the engine passes (``model(x, y)``): the run fails at its first step, and its account must lead with the cause and
this file's line (``where:``), torch's frames after it, once."""

from __future__ import annotations

import torch

from ddp_runner.tasks.api import Config, TaskParts
from ddp_runner.tasks.smoke import Regression, synthetic_dataset


class TakesOnlyX(Regression):
    """The smoke task's model, with a forward written for inference: no target, no loss."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return self.linear(x)


def build(cfg: Config, device: torch.device) -> TaskParts:
    """The smoke task's data and this model."""
    data = synthetic_dataset(cfg.data.num_samples, cfg.task.in_features, cfg.task.out_features, cfg.data.seed)
    return TaskParts(model=TakesOnlyX(cfg.task.in_features, cfg.task.out_features), train_set=data)
