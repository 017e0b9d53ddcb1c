"""The seed's DDP smoke test as a task: Linear(8, 1) on a synthetic TensorDataset, MSE loss.

An execution check, not a benchmark: it proves processes, devices, sampler and gradient sync work.
"""

from __future__ import annotations

import torch
from torch.utils.data import TensorDataset

from ddp_runner.tasks.api import TaskParts
from ddp_runner.tasks.engine.config import Config


class Regression(torch.nn.Module):
    """A linear layer whose forward returns the mean-squared error, per the task contract."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.mse_loss(self.linear(x), y)


def synthetic_dataset(num_samples: int, in_features: int, out_features: int, seed: int) -> TensorDataset:
    """The seed's data: ``randn(n, in)`` and ``randn(n, out)`` drawn from one fixed seed on every rank."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(num_samples, in_features, generator=g)
    y = torch.randn(num_samples, out_features, generator=g)
    return TensorDataset(x, y)


def build(cfg: Config, device: torch.device) -> TaskParts:
    """Model and data for the smoke task."""
    t, d = cfg.task, cfg.data
    data = synthetic_dataset(d.num_samples, t.in_features, t.out_features, d.seed)
    model = Regression(t.in_features, t.out_features)
    # Forward+backward of a linear layer: 6 FLOPs per weight per sample.
    return TaskParts(model=model, train_set=data, flops_per_sample=6.0 * t.in_features * t.out_features)
