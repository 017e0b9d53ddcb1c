"""What the loop carries from one optimizer step to the next for its reports (:class:`Loop`), and a log step's
two halves: :func:`open_log` starts gathering the step's values (and the stop vote) from every rank,
:func:`close_log` writes them once they are on the host, a step later, so that the GPU never waits for the log."""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from ddp_runner.tasks.engine import timing
from ddp_runner.tasks.engine.config import Config, auto_micro_batch
from ddp_runner.tasks.engine.diagnostics import heartbeat, profiling
from ddp_runner.tasks.engine.diagnostics import telemetry as gpu_telemetry
from ddp_runner.tasks.engine.reporting import log_window as tb
from ddp_runner.tasks.engine.reporting import metrics, task_metrics
from ddp_runner.tasks.engine.reporting.progress import Progress
from ddp_runner.tasks.engine.stop.vote import StopAgreement
from ddp_runner.tasks.engine.trackers.base import Trackers
from ddp_runner.tasks.engine.trackers.tensorboard import TensorBoard


@dataclass
class Loop:
    """What the loop carries from one optimizer step to the next."""

    meter: metrics.StepMeter
    profiler: profiling.StepProfiler
    writer: Any
    progress: Progress | None
    loss_sum: torch.Tensor          # sum of micro-step losses since the last log step (on the device)
    logged_step: int
    extras: task_metrics.Sums       # the task's extra metrics since the last log step (tasks/api.py)
    pending: tb.PendingLog | None = None
    window_end: Any = None              # the pending log step's window boundary (StepMeter.boundary)
    last: dict[str, float] = field(default_factory=dict)
    stop_agreed: int = 0                # a stop every rank voted for in a log step's gather (its signal)
    first_step_s: float | None = None   # from the driver's start to the end of this launch's first step
    start_step: int = 0                 # optimizer steps done before this launch (a resume)
    start_unix: float = 0.0             # when this launch's first step began
    first_step_end_unix: float | None = None
    # Where each step's time goes on this rank (tasks/engine/timing.py); off unless the loop sets one up.
    timer: timing.PhaseTimer = field(default_factory=lambda: timing.PhaseTimer(torch.device("cpu"), 0, 0))
    gpu_windows: dict[int, list[dict[str, float]]] = field(default_factory=dict)   # each rank's GPU, per window
    time_windows: dict[int, list[dict[str, float]]] = field(default_factory=dict)  # each rank's phase times
    micro_batch: int | None = None  # batch.per_rank=auto: the micro-batch now (micro_fit.py), logged as batch/micro


def rate_unit(tokens_per_sample: int | None) -> str:
    """What the console's throughput counts: tokens for a task with tokens, else samples."""
    return "tokens/s" if tokens_per_sample else "samples/s"


def ready_trackers(opening: Future, cfg: Config, run_dir: str, plan: dict[str, int], tokens: bool) -> Trackers:
    """Rank 0's loggers (``opening``: opened in the background at start-up); TensorBoard gets the plan and
    settings."""
    trackers = opening.result()
    board = next((t for t in trackers.trackers if isinstance(t, TensorBoard)), None)
    if board is None:
        return trackers
    # A sweep's swept values too: its jobs sit side by side in HPARAMS (tensorboard --logdir <sweep dir>).
    hparams = {"task": cfg.task.name, "lr": cfg.train.lr, "precision": cfg.train.precision, "device": cfg.device,
               **tb.swept_values(run_dir)}
    auto = auto_micro_batch(cfg)  # the plan is the start: batch.per_rank says so, batch/micro has the fitted size
    board.start(plan, {**hparams, **({"batch.per_rank": "auto"} if auto else {})}, tokens=tokens, micro=auto)
    return trackers


def keep_window(loop: Loop, state: Any, world_size: int) -> None:
    """Before a checkpoint: every rank's open logging window (its loss sum differs per rank) into the progress
    ``state`` (one collective), so that a resume logs exactly what an uninterrupted run would."""
    sums: list[Any] = [None] * world_size
    dist.all_gather_object(sums, float(loop.loss_sum))
    state.window_loss, state.logged_step = sums, loop.logged_step
    if loop.writer is not None:  # what the checkpoint covers is in the trackers: a resume leaves no gap
        loop.writer.flush()


def open_log(loop: Loop, step: int, lr: float, grad_norm: torch.Tensor, *, accumulation: int, world_size: int,
             telemetry: gpu_telemetry.Sampler | None, stop: StopAgreement | None) -> None:
    """Start gathering this log step's values (and the stop vote) from every rank; :func:`close_log` writes them
    later."""
    heartbeat.phase("log")
    loop.window_end = loop.meter.boundary()  # after this step's work, in the device's order
    loop.pending = pending = tb.PendingLog.start(
        step, loop.loss_sum / accumulation / (step - loop.logged_step), grad_norm, lr, loop.meter.steps,
        world_size, telemetry.window() if telemetry else None, loop.timer.window(),
        stop=stop.mine() if stop is not None else 0,
        extra=loop.extras.take() if loop.extras.names else None)
    if loop.micro_batch is not None:  # the size of this step's micro-batches, not of a later step's halving
        pending.known[tb.MICRO_BATCH] = float(loop.micro_batch)
    loop.logged_step = step
    loop.loss_sum.zero_()


def close_log(loop: Loop, *, device: torch.device, losses: list[float], unit: str) -> None:
    """Wait for a log step's reduced values, then write its scalars and progress; its loss joins ``losses``."""
    heartbeat.phase("log")
    pending, loop.pending = loop.pending, None
    assert pending is not None
    train_loss, gnorm, gpus, times = pending.values()
    loop.stop_agreed = loop.stop_agreed or pending.stop_vote()
    last = {"train/loss": train_loss, **task_metrics.named(loop.extras.names, pending.extra_means(), "train"),
            "lr": pending.lr, "grad_norm": gnorm,
            **loop.meter.close_window(pending.window_steps, end=loop.window_end),
            "memory/peak_gb": tb.peak_memory_gb(device)}
    losses.append(train_loss)
    for r, g in gpus.items():
        loop.gpu_windows.setdefault(r, []).append(g)
    for r, w in times.items():
        loop.time_windows.setdefault(r, []).append(w)
    if loop.writer is not None:  # every rank's GPU and phase times, gathered: rank 0 logs them all
        loop.writer.log({**last, **{f"gpu{r}/{k}": v for r, g in gpus.items() for k, v in g.items()},
                         **timing.scalars(times), **pending.known}, pending.step)
    if loop.progress is not None:
        rate_key = "perf/tokens_per_s" if unit == "tokens/s" else "perf/samples_per_s"
        loop.progress.update(pending.step, train_loss, last.get(rate_key) or last["perf/samples_per_s"])
    loop.last = last
