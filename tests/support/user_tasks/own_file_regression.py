"""A task of the user's own (run from this folder as ``task.module=own_file_regression
task.checks=own_file_regression_checks``) that loads its training set from a file of its own (``+task.file=``):
however many records the file holds, whatever ``data.num_samples`` says. Its checks module tells the driver that
number before it plans (``train_samples(cfg)``).
"""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import TensorDataset

from ddp_runner.tasks.api import Config, TaskParts

FEATURES = 4  # a record: FEATURES float32 inputs, then one float32 target
RECORD_BYTES = 4 * (FEATURES + 1)


def write(path: str, n: int, seed: int = 0) -> None:
    """A file of ``n`` records whose target is the sum of the inputs."""
    x = np.random.default_rng(seed).standard_normal((n, FEATURES), dtype=np.float32)
    np.concatenate([x, x.sum(axis=1, keepdims=True)], axis=1).astype(np.float32).tofile(path)


def load(path: str) -> TensorDataset:
    """Every record of the file."""
    rows = torch.from_numpy(np.fromfile(path, dtype=np.float32).reshape(-1, FEATURES + 1))
    return TensorDataset(rows[:, :FEATURES].clone(), rows[:, FEATURES:].clone())


class Regression(torch.nn.Module):
    """One linear layer; forward returns the micro-batch's mean squared error."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(FEATURES, 1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.mse_loss(self.lin(x), y)


def build(cfg: Config, device: torch.device) -> TaskParts:
    """The model and the file's records (data.num_samples plays no part)."""
    return TaskParts(model=Regression(), train_set=load(str(cfg.task.file)))
