"""The run summary a rank hands back when training has ended or stopped (rank 0's goes into summary.json): the
final and median metrics, bounded loss and throughput series, goodput, where the time went, how it compiled."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

import torch

from ddp_runner.contract import layout, series
from ddp_runner.contract.run_files import TrainSummary
from ddp_runner.contract.stops import StopRecord
from ddp_runner.tasks.engine import compile_cache, startup, timing
from ddp_runner.tasks.engine.config import Config
from ddp_runner.tasks.engine.diagnostics import telemetry as gpu_telemetry
from ddp_runner.tasks.engine.reporting import metrics
from ddp_runner.tasks.engine.reporting.log_step import Loop
from ddp_runner.tasks.engine.scaling_facts import entry as scaling_facts
from ddp_runner.tasks.engine.train_state import TrainState


def window_ends(start_step: int, last_step: int, log_every: int) -> list[int]:
    """The optimizer step that ends each logging window of a launch that began after ``start_step`` and ended at
    ``last_step``: every multiple of ``log_every``, and the last step."""
    ends = list(range((start_step // log_every + 1) * log_every, last_step + 1, log_every))
    return ends if ends and ends[-1] == last_step else [*ends, last_step]


def build(loop: Loop, state: TrainState, cfg: Config, *, params: Sequence[torch.nn.Parameter], global_batch: int,
          tokens_per_sample: int | None, first_commit_unix: float | None, compile_facts: dict[str, Any] | None,
          validation: Any, resumed_from: str | None, stopped: StopRecord | None,
          stop_vote: dict[str, float] | None, micro_batch: dict[str, Any] | None = None) -> TrainSummary:
    """The summary, once training has ended (its final checkpoint and validation done) or stopped; closes the
    console's progress and the trackers. ``validation``: the run's :class:`~ddp_runner.tasks.engine.validation.
    Validator`; ``stopped``: the stop record, if a stop ended the run; ``micro_batch``: the fitted micro-batch's
    record (``batch.per_rank=auto``, tasks/engine/micro_fit.py)."""
    if loop.progress is not None:
        loop.progress.close()
    summary: TrainSummary = {
        "steps": state.step, "epochs_started": state.epoch + (state.micro_in_epoch > 0),
        "final": dict(loop.last),
        "val_loss": validation.loss,
        # The task's extra metrics (tasks/api.py): the last logged train/<name>, the last validation's val/<name>.
        "metrics": {**{k: v for k, v in loop.last.items() if k.startswith("train/") and k != "train/loss"},
                    **validation.metrics},
        "median": loop.meter.medians(),
        **series_of(loop, state, cfg.train.log_every),
        # Each rank's GPU: medians over the logging windows but the first (compilation); empty without NVML.
        "gpus": {str(r): gpu_telemetry.medians(ws[1:] or ws) for r, ws in sorted(loop.gpu_windows.items())},
        "time_to_first_step_s": loop.first_step_s,
        "goodput": goodput(loop, state, global_batch, tokens_per_sample, first_commit_unix),
        # Each rank's data, compute, exposed gradient sync and optimizer time per step; slowest and fastest rank.
        "time_breakdown": timing.summarize(loop.time_windows, loop.timer.every),
        # Gradient and parameter bytes, threads and cores: what the scaling projection prices (ddp-compare).
        **scaling_facts(params, cfg),
        "compile": compile_facts,
        # How often validation ran, its seconds (also goodput's "validation") and the graphs it compiled.
        "validation": validation.summary(),
        "resumed_from": resumed_from,
        "stopped": stopped,
        "stop_vote": stop_vote,
    }
    if micro_batch is not None:  # batch.per_rank=auto: the micro-batch the ranks settled on, and why
        summary["micro_batch"] = micro_batch
    if loop.writer is not None:
        loop.writer.close()
        summary["trackers"] = loop.writer.report()
    return summary


def series_of(loop: Loop, state: TrainState, every: int) -> dict[str, Any]:
    """summary.json's series, each at most ``series.MAX_POINTS`` points with the step of each (the full ones are
    in TensorBoard): ``losses`` (every logged train loss since step 0, a resume's earlier ones included) and
    ``perf_windows`` (this launch's logging windows but the first: start-up and compilation)."""
    done = state.step
    losses, loss_steps = series.bounded(state.losses, series.log_steps(len(state.losses), every, done))
    history = loop.meter.history
    ends = window_ends(loop.start_step, done, every)[1:]
    n = len(history["step_time_s"])
    ends = (ends + [done] * n)[:n]  # as many ends as windows, whatever a stop left open
    keep = series.kept_indices(history["step_time_s"])
    windows: dict[str, Any] = {k: [v[i] for i in keep] if len(v) == n else list(v) for k, v in history.items()}
    windows.update(steps=[ends[i] for i in keep], count=n)
    return {"perf_windows": windows, "perf_span_unix": loop.meter.span_unix,  # when those windows ran
            "losses": losses, "loss_steps": loss_steps, "losses_logged": len(state.losses)}


def goodput(loop: Loop, state: TrainState, global_batch: int, tokens_per_sample: int | None,
            first_commit_unix: float | None) -> dict[str, Any]:
    """Throughput over this launch's whole wall-clock (from the driver's start), the shares of start-up,
    the first step (compilation), checkpoints, validation and training, and the time to the first committed
    checkpoint."""
    now = time.time()
    t0 = float(os.environ.get(layout.ENV_T0, loop.start_unix))
    first_end = loop.first_step_end_unix or now
    steps = state.step - loop.start_step
    out = metrics.goodput(
        wall_s=now - t0, startup_s=loop.start_unix - t0, first_step_s=first_end - loop.start_unix,
        excluded={k: v for k, v in loop.meter.excluded.items() if v > 0},
        samples=steps * global_batch, tokens_per_sample=tokens_per_sample)
    out["time_to_first_checkpoint_s"] = first_commit_unix - t0 if first_commit_unix is not None else None
    out["startup_parts"] = startup.parts()  # where the start-up went, on rank 0
    return out


def compile_line(facts: dict[str, Any] | None, first_step_s: float | None) -> str:
    """The rank log's line on compilation after the first step: its time from launch, scope and cache use."""
    facts = facts or {}
    return (f"compile: first step {first_step_s or 0.0:.1f} s from launch, scope {facts.get('scope')},"
            f" cache {facts.get('cache_dir')}: {facts.get('cache_hits', 0)} hits,"
            f" {facts.get('cache_misses', 0)} misses")


def compile_facts(cfg: Config, cache_dir: str | None) -> dict[str, Any] | None:
    """How this rank (rank 0 reports) compiled: the scope, the cache directory, its hits and misses, and the
    seconds torch spent per compile phase."""
    t = cfg.train
    if not t.compile:
        return None
    return {"scope": t.get("compile_scope") or "model", "cache_dir": cache_dir,
            **(compile_cache.hits() if cache_dir else {}), "seconds": compile_cache.seconds()}
