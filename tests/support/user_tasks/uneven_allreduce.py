"""A task of the user's own (run from this folder as ``task.module=uneven_allreduce``) whose ranks call
mismatched collectives: rank 1 all-reduces a tensor of another shape than rank 0's. With debug=true
(TORCH_DISTRIBUTED_DEBUG=DETAIL) torch checks every collective's fingerprint across ranks and names the mismatch.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ddp_runner.tasks.api import Config, TaskParts
from ddp_runner.tasks.smoke import Regression, synthetic_dataset


class Mismatched(Regression):
    """The smoke task's model, plus one collective whose shape depends on the rank."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(torch.zeros(3 + 2 * dist.get_rank()))
        return super().forward(x, y)


def build(cfg: Config, device: torch.device) -> TaskParts:
    """The smoke task's data with the mismatched model."""
    return TaskParts(model=Mismatched(cfg.task.in_features, cfg.task.out_features),
                     train_set=synthetic_dataset(cfg.data.num_samples, cfg.task.in_features,
                                                 cfg.task.out_features, cfg.data.seed))
