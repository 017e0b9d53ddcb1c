"""A task of your own: a small image classifier on synthetic images, run by ddp-run from this folder.

A task is a module with ``build(cfg, device) -> TaskParts``: the model (whose forward returns the mean loss),
the datasets and, optionally, FLOPs per sample. It never owns a loop: ddp-run's engine does DDP, the sampler,
accumulation, precision, checkpoints and resume. Run it from this folder with its own task YAML::

    ddp-run --config-dir conf task=tiny_cnn device=cpu world_size=2
"""

from __future__ import annotations

import torch
from torch.utils.data import TensorDataset

from ddp_runner.tasks.api import Config, TaskParts


class TinyCNN(torch.nn.Module):
    """Two conv layers and a linear head; ``forward(x, y)`` returns the mean cross-entropy and the accuracy."""

    def __init__(self, classes: int, width: int, dropout: float) -> None:
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(1, width, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(width, width, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(2),
            torch.nn.Flatten(), torch.nn.Dropout(dropout),
        )
        self.head = torch.nn.Linear(4 * width, classes)  # one feature map per quadrant

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        logits = self.head(self.features(x))
        accuracy = (logits.argmax(dim=1) == y).float().mean()  # an extra metric: logged beside the loss
        return torch.nn.functional.cross_entropy(logits, y), {"accuracy": accuracy}


def synthetic_images(n: int, classes: int, size: int, seed: int) -> TensorDataset:
    """Noisy images whose class sets which quadrant is bright: learnable, and the same on every rank."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, classes, (n,), generator=g)
    x = 0.5 * torch.randn(n, 1, size, size, generator=g)
    half = size // 2
    for c in range(classes):
        r, q = divmod(c % 4, 2)
        x[y == c, :, r * half:(r + 1) * half, q * half:(q + 1) * half] += 1.0 + c // 4
    return TensorDataset(x, y)


def build(cfg: Config, device: torch.device) -> TaskParts:
    """Model and data from ``task.*`` (see conf/task/tiny_cnn.yaml)."""
    t = cfg.task
    train = synthetic_images(t.train_samples, t.classes, t.image_size, seed=1)
    val = synthetic_images(t.val_samples, t.classes, t.image_size, seed=2)
    model = TinyCNN(t.classes, t.width, t.dropout)
    return TaskParts(model=model, train_set=train, val_set=val)
