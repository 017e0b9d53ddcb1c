"""One phase of a run outside its optimizer steps (``validation``, ``checkpoint``, ``finish``), under one name
everywhere: the heartbeat (the driver's watchdog names the phase a rank hangs in), the step meter (the time left
out of the steps', summary.json's goodput ``excluded``) and the stop tests' hook (``DDP_RUNNER_STOP_AT=<name>@<step>``,
``faults.in_phase``) all read the same name. The phases inside a step (``data``, ``forward_backward``, ``sync``,
``optimizer``, ``log``) are the heartbeat's alone: they are the step's own time and no test stops in them."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from ddp_runner.tasks.engine.diagnostics import faults, heartbeat
from ddp_runner.tasks.engine.reporting.metrics import StepMeter

PHASES = ("validation", "checkpoint", "finish")


@contextlib.contextmanager
def phase(name: str, *, rank: int, step: int, local_dir: str, meter: StepMeter | None = None) -> Iterator[None]:
    """Run the block as phase ``name`` at optimizer step ``step``; with ``meter``, its time (device drained on entry
    and exit) is not the steps' but ``name``'s."""
    assert name in PHASES, name
    with meter.paused(name) if meter is not None else contextlib.nullcontext():
        heartbeat.phase(name)
        faults.in_phase(name, rank, step, local_dir)
        yield
