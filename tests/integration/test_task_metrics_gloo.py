"""A task's extra metrics across two gloo ranks: the log step's gather carries them (no collective of their own)
and averages them over the ranks; validation weights each batch by its size, every sample counted once."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.utils.data import TensorDataset

from ddp_runner.tasks.engine.rank import Context
from ddp_runner.tasks.engine.reporting import log_window as tb
from ddp_runner.tasks.engine.validation import evaluate
from tests.support.spawn import spawn


class MeanOfY(torch.nn.Module):
    """Loss 0; its one metric is the batch's mean label, so the exact validation value is the labels' mean."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(()))

    def forward(self, x: torch.Tensor, y: torch.Tensor):
        return self.w * x.sum(), {"mean_y": y.float().mean()}


def _worker(rank: int, world: int, tmp: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=rank, world_size=world)
    try:
        ctx = Context(rank, rank, world, torch.device("cpu"), tmp, tmp, None)
        data = TensorDataset(torch.zeros(7, 1), torch.arange(7))  # 7 samples: rank 0 has 4, rank 1 has 3
        found: dict[str, float] = {}
        loss = evaluate(MeanOfY(), data, ctx, batch=2, precision="fp32", metrics=found, names=("mean_y",))
        pending = tb.PendingLog.start(5, torch.tensor(float(rank)), torch.tensor(1.0), 0.1, 1, world,
                                      extra=torch.tensor([rank + 1.0, 10.0 * rank]))
        values = pending.values()
        torch.save({"loss": loss, "val": found, "train_loss": values[0], "extra": pending.extra_means()},
                   f"{tmp}/out-{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_extra_metrics_are_reduced_across_ranks(tmp_path: Path):
    spawn(_worker, args=(2, str(tmp_path)))
    out = [torch.load(tmp_path / f"out-{r}.pt") for r in range(2)]
    assert out[0] == out[1], "every rank gets the same, reduced values"
    assert out[0]["loss"] == 0.0
    assert out[0]["val"] == {"mean_y": pytest.approx(3.0)}  # (0+…+6)/7, not the mean of the batch means
    assert out[0]["train_loss"] == 0.5 and out[0]["extra"] == pytest.approx([1.5, 5.0])
