"""A task's extra metrics: what a forward may return (tasks/engine/reporting/task_metrics.py), and their sums between
log steps."""

from __future__ import annotations

import pytest
import torch

from ddp_runner.tasks.engine.reporting.task_metrics import Sums, named, split_output


def test_a_plain_loss_has_no_extra_metrics():
    loss = torch.tensor(0.5, requires_grad=True)
    got, extra = split_output(loss)
    assert got is loss and extra == {}


def test_loss_and_metrics_are_split_detached_and_float():
    loss = torch.tensor(0.5, requires_grad=True)
    acc = (torch.tensor([1, 0, 1, 1]) == torch.tensor([1, 1, 1, 1])).float().mean().requires_grad_()
    got, extra = split_output((loss, {"accuracy": acc, "perplexity": 3}))
    assert got is loss
    assert set(extra) == {"accuracy", "perplexity"}
    assert extra["accuracy"].item() == 0.75 and not extra["accuracy"].requires_grad
    assert extra["perplexity"].dtype == torch.float32 and extra["perplexity"].shape == ()


@pytest.mark.parametrize("out, problem", [
    ([torch.tensor(1.0)], "must return the mean loss"),
    ((1.0, {"accuracy": 1.0}), "must be a scalar tensor"),
    ((torch.tensor(1.0), {"loss": 1.0}), "not loss"),
    ((torch.tensor(1.0), {"": 1.0}), "metric name"),
    ((torch.tensor(1.0), {"accuracy": torch.ones(3)}), "shape (3,)"),
])
def test_a_malformed_output_says_what_to_return(out, problem):
    with pytest.raises((TypeError, ValueError)) as info:
        split_output(out)
    assert problem in str(info.value)


def test_sums_average_the_micro_steps_then_start_again():
    sums = Sums(torch.device("cpu"))
    sums.add({"accuracy": torch.tensor(0.5), "b": torch.tensor(2.0)})
    sums.add({"accuracy": torch.tensor(1.0), "b": torch.tensor(4.0)})
    assert sums.names == ("accuracy", "b")
    assert sums.take().tolist() == [0.75, 3.0]
    sums.add({"accuracy": torch.tensor(0.25), "b": torch.tensor(1.0)})
    assert sums.take().tolist() == [0.25, 1.0]


def test_sums_weight_batches_by_size_and_refuse_changing_names():
    sums = Sums(torch.device("cpu"), names=("accuracy",))
    sums.add({"accuracy": torch.tensor(1.0)}, weight=3)
    sums.add({"accuracy": torch.tensor(0.0)}, weight=1)
    assert sums.take().tolist() == [0.75]
    with pytest.raises(ValueError, match="same names"):
        sums.add({"recall": torch.tensor(1.0)})


def test_a_task_without_metrics_costs_an_empty_sum():
    sums = Sums(torch.device("cpu"))
    sums.add({})
    assert sums.names == () and sums.take().numel() == 0
    assert named((), [], "train") == {}
    assert named(("accuracy",), [0.5], "val") == {"val/accuracy": 0.5}
