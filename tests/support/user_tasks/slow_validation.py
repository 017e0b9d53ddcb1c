"""A task of the user's own (``task.module=slow_validation``) whose validation is slow but alive: every validation
forward sleeps ``SLEEP_S``, so one validation takes several times a short ``watchdog.timeout_s``. The watchdog must
count each validation batch as progress and leave the run alone.
"""

from __future__ import annotations

import time

import torch

from ddp_runner.tasks.api import Config, TaskParts
from ddp_runner.tasks.smoke import Regression, synthetic_dataset

SLEEP_S = 0.25


class SlowWhenEvaluating(Regression):
    """The smoke task's model; slow in eval mode only."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if not self.training:
            time.sleep(SLEEP_S)
        return super().forward(x, y)


def build(cfg: Config, device: torch.device) -> TaskParts:
    """The smoke task's data, its first samples again as the validation set."""
    data = synthetic_dataset(cfg.data.num_samples, cfg.task.in_features, cfg.task.out_features, cfg.data.seed)
    return TaskParts(model=SlowWhenEvaluating(cfg.task.in_features, cfg.task.out_features), train_set=data,
                     val_set=data)
