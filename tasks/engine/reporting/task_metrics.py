"""A task's extra metrics (accuracy, perplexity, …) beside its loss: read from the model's output, summed on the
device between log steps, and reduced across ranks with the loss's own gather (no collective of their own).

The contract (``tasks/api.py``): ``model(x, y)`` returns the micro-batch's mean loss, or ``(loss, {name: value})``
where each value is that micro-batch's mean of the metric (a scalar tensor or a number). Means over micro-batches
of one size are the mean over their samples; validation weights each batch by its size.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

RESERVED = ("loss",)


def split_output(out: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The loss and the extra metrics (detached, float32 scalars) of one forward's output."""
    if isinstance(out, torch.Tensor):
        return out, {}
    if isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], Mapping):
        loss, extra = out
        if not isinstance(loss, torch.Tensor):
            raise TypeError(f"the model returned ({type(loss).__name__}, metrics): the loss must be a scalar tensor")
        return loss, {_name(k): _scalar(k, v, loss.device) for k, v in extra.items()}
    raise TypeError(f"the model returned {type(out).__name__}: forward(x, y) must return the mean loss (a scalar"
                    " tensor) or (loss, {name: value}) with the task's extra metrics")


def _name(key: Any) -> str:
    if not isinstance(key, str) or not key or key in RESERVED or not all(c.isalnum() or c in "_-." for c in key):
        raise ValueError(f"metric name {key!r}: use a short name such as 'accuracy' (letters, digits, _ - .), not"
                         f" {', '.join(RESERVED)}")
    return key


def _scalar(key: str, value: Any, device: torch.device) -> torch.Tensor:
    t = value.detach() if isinstance(value, torch.Tensor) else torch.as_tensor(value)
    if t.numel() != 1:
        raise ValueError(f"metric {key!r} has shape {tuple(t.shape)}: return the micro-batch's mean, a scalar")
    return t.reshape(()).float().to(device)


class Sums:
    """Sums of each extra metric over the micro-steps (or samples) since the last :meth:`take`, on the device."""

    def __init__(self, device: torch.device, names: tuple[str, ...] | None = None) -> None:
        self.device = device
        # Fixed by the first output (or given): every rank must send the same length in the log step's gather.
        self.names = names
        self.sums = torch.zeros(len(names or ()), device=device)
        self.weight = 0.0

    def add(self, metrics: Mapping[str, torch.Tensor], weight: float = 1.0) -> None:
        """Add one output's metrics, weighted (``weight``: 1 per micro-step, or a validation batch's size)."""
        if self.names is None:
            self.names = tuple(sorted(metrics))
            self.sums = torch.zeros(len(self.names), device=self.device)
        if set(metrics) != set(self.names):
            raise ValueError(f"the model returned the metrics {sorted(metrics)}, earlier {list(self.names)}: return"
                             " the same names from every forward")
        if self.names:
            self.sums += torch.stack([metrics[n] for n in self.names]) * weight
        self.weight += weight

    def take(self) -> torch.Tensor:
        """The means since the last call (one value per name, on the device), then start again."""
        means = self.sums / max(self.weight, 1e-12)
        self.sums = torch.zeros_like(self.sums)
        self.weight = 0.0
        return means


def named(names: tuple[str, ...] | None, values: list[float], prefix: str) -> dict[str, float]:
    """``{prefix/name: value}`` for the scalars TensorBoard and summary.json hold."""
    return {f"{prefix}/{n}": v for n, v in zip(names or (), values, strict=True)}
