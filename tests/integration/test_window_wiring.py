"""The engine closes each logging window at the boundary its log step marked, not when it gets around to reading
the values (issue 33: the last window read up to 36% fast). Trainer.log and Trainer._finish_log run here on a
stand-in trainer in a one-process gloo group, with a clock whose every mark is one second after the last."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from ddp_runner.tasks.engine.reporting import task_metrics
from ddp_runner.tasks.engine.reporting.log_step import Loop, close_log, open_log
from ddp_runner.tasks.engine.reporting.metrics import StepMeter


class Ticks:
    """Each mark one second after the previous one: a window's length says which mark closed it."""

    def __init__(self) -> None:
        self.n = 0

    def mark(self) -> int:
        self.n += 1
        return self.n

    def seconds(self, start: int, end: int) -> float:
        return float(end - start)


@pytest.fixture
def group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_a_window_ends_at_its_log_steps_mark(group):
    cpu = torch.device("cpu")
    meter = StepMeter(samples_per_step=8, world_size=1, tokens_per_sample=None, flops_per_sample=None, peak=None,
                      clock=Ticks())  # its start is mark 1
    loop = Loop(meter, None, None, None, torch.tensor(2.0), 0, task_metrics.Sums(cpu))  # type: ignore[arg-type]
    losses: list[float] = []
    meter.step_done()
    open_log(loop, 1, 0.1, torch.tensor(1.0), accumulation=1, world_size=1, telemetry=None,
             stop=None)  # marks the boundary: mark 2
    meter.step_done()  # the next step, queued before the values are read
    meter.clock.mark()  # time goes by before the host reads them (mark 3)
    close_log(loop, device=cpu, losses=losses, unit="samples/s")
    assert loop.last["perf/step_time_s"] == 1.0, "closed at the log step's mark (2), not at reading time (4)"
    assert meter.steps == 1 and losses == [2.0]
