"""The training loop alone: set-up of its parts, then optimizer steps as named pieces (micro-step, optimizer step)
to the last step or an agreed stop. Every task supplies model, data and loss (``ddp_runner.tasks.api.TaskParts``);
the parallel strategy (``strategy/``) wraps the model; components beside the loop decide for themselves: the data
feed, the validator (when and how), the checkpoint manager (when a save is due), the stop controller (what a stop
saves, and the end of training), the reporting (log window, summary).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import torch

from ddp_runner.contract import layout
from ddp_runner.contract.stops import StopRecord
from ddp_runner.tasks import registry
from ddp_runner.tasks.api import TaskParts
from ddp_runner.tasks.engine import compile_cache, micro_fit, startup, timing
from ddp_runner.tasks.engine import phase as phases
from ddp_runner.tasks.engine.checkpoint.manager import CheckpointManager
from ddp_runner.tasks.engine.config import BatchPlan, Config, auto_micro_batch
from ddp_runner.tasks.engine.data_feed import Batches, DataFeed, settle_buckets
from ddp_runner.tasks.engine.diagnostics import faults, heartbeat, profiling
from ddp_runner.tasks.engine.diagnostics import telemetry as gpu_telemetry
from ddp_runner.tasks.engine.optim import apply_inductor_settings, build_optimizer, lr_factor
from ddp_runner.tasks.engine.rank import Context, autocast
from ddp_runner.tasks.engine.reporting import log_step, metrics, summary, task_metrics
from ddp_runner.tasks.engine.reporting.log_step import Loop
from ddp_runner.tasks.engine.reporting.progress import Progress
from ddp_runner.tasks.engine.stop.controller import StopController
from ddp_runner.tasks.engine.stop.vote import StopAgreed, StopAgreement
from ddp_runner.tasks.engine.strategy import factory, grad_sync
from ddp_runner.tasks.engine.strategy.base import Strategy
from ddp_runner.tasks.engine.train_state import TrainState
from ddp_runner.tasks.engine.validation import Validator

_say = functools.partial(print, flush=True)  # a line in this rank's log


class Trainer:
    """One run of the training loop on this rank."""

    def __init__(self, cfg: Config, ctx: Context, writer_future: Future | None = None) -> None:
        self.cfg, self.ctx, self.writer_future = cfg, ctx, writer_future
        t = cfg.train
        torch.manual_seed(cfg.seed)  # same init on every rank (DDP also broadcasts rank 0's weights)
        self.parts: TaskParts = registry.build(cfg, ctx.device)
        self.model = self.parts.model.to(ctx.device)
        # Same weights everywhere, but each rank its own random stream from here on (dropout masks must
        # differ across ranks that see different data). A resume restores every rank's saved stream.
        torch.manual_seed(cfg.seed + ctx.rank)
        if t.compile and t.get("inductor"):
            apply_inductor_settings(t.inductor)
        # Before anything compiles: jobs and reruns under one output root share what was compiled.
        self.compile_cache = (compile_cache.configure(str(cfg.output.root))
                              if t.compile and t.get("compile_cache", True) else None)
        self.strategy: Strategy = factory.build(cfg, self.model, ctx.device, ctx.local_rank, ctx.world_size)
        # zero1 partitions the optimizer state over the ranks; the others step the optimizer as it is.
        self.optimizer = self.strategy.wrap_optimizer(build_optimizer(t, self.strategy.params))
        self.scaler = torch.amp.GradScaler(ctx.device.type) if t.precision == "fp16" else None
        self.plan, why = micro_fit.start_plan(cfg, ctx.world_size, ctx.run_dir)
        self.per_rank, self.accumulation, auto = self.plan.per_rank, self.plan.accumulation, auto_micro_batch(cfg)
        self.feed = DataFeed(cfg, ctx, self.parts.train_set, self.per_rank, self.accumulation, by_step=auto)
        self.fit = micro_fit.MicroFit(self.plan, why, ctx, auto=auto, resize=self._resized)  # auto: halves on OOM
        self.state = TrainState()
        self.total_steps = self.feed.total_steps(self.state)
        self.extras: task_metrics.Sums | None = None  # the loop's extra metric sums (names known after a forward)
        self.validator = Validator(cfg, ctx, self.parts, self.model, per_rank=self.per_rank,
                                   collective_forward=self.strategy.collective_forward, total_steps=self.total_steps,
                                   phase=self.phase,
                                   train_names=lambda: None if self.extras is None else self.extras.names)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer,
            lambda s: lr_factor(s, self.total_steps, t.schedule, t.warmup_steps, t.min_lr_ratio),
        )
        self.checkpoints = CheckpointManager(
            cfg, run_dir=ctx.run_dir, rank=ctx.rank, console=ctx.console, plan=self.plan, strategy=self.strategy,
            optimizer=self.optimizer, scheduler=self.scheduler, scaler=self.scaler)
        self.checkpoints.micro_fit = self.fit  # auto: checkpoints record the fitted micro-batch, a resume keeps it
        # Clock, power, temperature and power-cap state of this rank's GPU, per logging window (None: no NVML).
        self.telemetry = gpu_telemetry.Sampler.start(ctx.device) if t.get("gpu_telemetry", True) else None
        self.stops = StopController(cfg, ctx, self.checkpoints, phase=self.phase, save=self.checkpoint,
                                    finish_log=self._finish_log)
        self.loop: Loop | None = None  # this launch's loop, once it starts

    @property
    def resumed_from(self) -> str | None:
        """The checkpoint this launch resumed from (None: a fresh start)."""
        return self.checkpoints.resumed_from

    @property
    def stopped(self) -> StopRecord | None:
        """The stop the ranks agreed on: its step, signal, checkpoint (None: no stop)."""
        return self.stops.stopped

    def maybe_resume(self) -> None:
        """Continue from the checkpoint the manager picks, if any: its progress, and the steps left from there."""
        resumed = self.checkpoints.maybe_resume()
        if resumed is not None:
            self.state = resumed
            self.total_steps = self.feed.total_steps(self.state)
            self.validator.plan(self.total_steps)

    def _resized(self, plan: BatchPlan, replay: bool) -> None:
        """``batch.per_rank=auto`` changed the micro-batch (micro_fit.py): every step is split anew from here on."""
        self.plan = self.checkpoints.plan = plan
        self.per_rank = self.validator.per_rank = plan.per_rank  # validation's batches too: they fit
        self.accumulation = plan.accumulation
        self.feed.resize(plan.per_rank, replay)  # replay: the step is retried on the same samples

    def checkpoint(self, loop: Loop | None = None, final: bool = False) -> None:
        """Save a checkpoint of where training stands now (collective: every rank calls it); with ``loop``, the
        losses of the logging window still open too, so that a resume logs exactly what an uninterrupted run would."""
        if loop is not None:
            log_step.keep_window(loop, self.state, self.ctx.world_size)
        self.checkpoints.save(self.state, final=final)

    def phase(self, name: str, pause: bool = True) -> contextlib.AbstractContextManager:
        """Phase ``name`` of this run at the current step (``phase.py``); ``pause``: out of the steps' time."""
        meter = self.loop.meter if pause and self.loop is not None else None
        return phases.phase(name, rank=self.ctx.rank, step=self.state.step, local_dir=self.ctx.local_dir, meter=meter)

    def train(self) -> dict[str, Any]:
        """Run optimizer steps to ``total_steps`` (or to an agreed stop), then checkpoint and validate once more;
        return the summary."""
        batches = self.feed.micro_batches(self.state)
        if self.resumed_from is not None and self.state.step < self.total_steps:  # no step left: it only validates
            batches = settle_buckets(batches, self.strategy, self.ctx, self.cfg.train.precision, _say)
        loop = self.loop = self._start_loop()
        with self.stops.taking_stops() as stop:
            self._loop(loop, batches, stop)
            loop.profiler.finish(self.state.step)  # when training ended inside the traced steps
            if self.stopped is None:
                self.stops.end(loop, self.state, self.validator)
        with self.phase("finish", pause=False):
            return summary.build(
                loop, self.state, self.cfg, params=self.strategy.params, global_batch=self.plan.global_batch,
                tokens_per_sample=self.parts.tokens_per_sample, first_commit_unix=self.checkpoints.first_commit_unix,
                compile_facts=summary.compile_facts(self.cfg, self.compile_cache), validation=self.validator,
                resumed_from=self.resumed_from, stopped=self.stopped, micro_batch=self.fit.record(),
                stop_vote=self.stops.vote.stats() if self.stops.vote is not None else None)

    def _loop(self, loop: Loop, batches: Batches, stop: StopAgreement) -> None:
        """Optimizer steps to ``total_steps``, or to the step boundary where the ranks agree to stop."""
        while self.state.step < self.total_steps:
            # Where the profiler starts or stops, the pause drains the device before its clock starts: the
            # profiler's own drain would otherwise count the queued training work as the pause's time.
            with loop.meter.paused("profile", sync=loop.profiler.acts_before(self.state.step + 1)):
                loop.profiler.before_step(self.state.step + 1)
            loop.timer.begin_step(self.state.step + 1)
            self.fit.step(functools.partial(self.micro_step, batches, loop), self.state, loop, self.strategy.params)
            heartbeat.phase("optimizer")
            lr, grad_norm = self.optimizer_step()
            loop.timer.end_step()
            self.state.step += 1
            loop.meter.step_done()
            if self._after_step(loop, lr, grad_norm, stop):
                return

    def _after_step(self, loop: Loop, lr: float, grad_norm: torch.Tensor, stop: StopAgreement) -> bool:
        """A step's bookkeeping: log, validate, checkpoint when due, then the stop vote; True: the ranks stopped."""
        step, last_step = self.state.step, self.total_steps
        heartbeat.step(step)
        faults.after_step(self.ctx.rank, step)
        if loop.pending is not None:
            # The previous log step's values. Waiting for them here, with this step already queued, keeps the
            # GPU busy while the host logs; a sync right at the log step would drain its queue.
            self._finish_log(loop)
        with loop.meter.paused("profile", sync=loop.profiler.acts_after(step)):  # writing the trace is not a step
            loop.profiler.after_step(step)
        if loop.first_step_s is None:
            self._after_first_step(loop)
        log_due = step % self.cfg.train.log_every == 0 or step == last_step
        if log_due:
            log_step.open_log(loop, step, lr, grad_norm, accumulation=self.accumulation,
                              world_size=self.ctx.world_size, telemetry=self.telemetry, stop=stop)
        val_due = self.validator.should_validate(step, last_step)
        ckpt_due = self.checkpoints.due(step, last_step)
        # Finished right away when nothing is in flight to keep busy (a CPU run: the step is already done, and a
        # late close would time the next step instead), and before anything that reads the losses or syncs.
        if loop.pending is not None and (loop.pending.ready is None or val_due or ckpt_due or step == last_step):
            self._finish_log(loop)  # the checkpoint holds the losses
        if val_due and not loop.stop_agreed:  # an agreed stop saves first: the validation would only delay it
            try:
                self.validator.run(loop.writer, step, loop.progress, stop)
            except StopAgreed as agreed:  # every rank left the validation at the same batch
                self.stops.stop(loop, self.state, agreed.signum, saved=False, during=f"the validation at step {step}")
                return True
        if ckpt_due:
            with self.phase("checkpoint"):  # the save's blocking time is not a training step
                self.checkpoint(loop)
        if (signum := loop.stop_agreed or (0 if log_due else stop.poll())) and step < last_step:
            self.stops.stop(loop, self.state, signum, saved=ckpt_due)
            return True
        return False

    def _start_loop(self) -> Loop:
        ctx, t = self.ctx, self.cfg.train
        meter = metrics.StepMeter(self.plan.global_batch, ctx.world_size,
                                  self.parts.tokens_per_sample, self.parts.flops_per_sample,
                                  metrics.peak_flops(ctx.device_name, t.precision),
                                  sync=torch.cuda.synchronize if ctx.device.type == "cuda" else None,
                                  clock=timing.DeviceClock() if ctx.device.type == "cuda" else None)
        prof_cfg = t.get("profile") or {}
        profiler = profiling.StepProfiler(
            os.path.join(ctx.local_dir, layout.PROFILE), ctx.rank, self.state.step + int(prof_cfg.get("start", 0)),
            int(prof_cfg.get("steps", 0)), ctx.device, say=_say if ctx.is_main else None,
        )
        writer = (log_step.ready_trackers(self.writer_future, self.cfg, ctx.run_dir, self.plan.as_dict(),
                                          tokens=bool(self.parts.tokens_per_sample))
                  if self.writer_future is not None else None)
        progress = (Progress(ctx.console, self.total_steps, self.state.step,
                             unit=log_step.rate_unit(self.parts.tokens_per_sample)) if ctx.is_main else None)
        timer = timing.PhaseTimer(ctx.device, int(t.get("timing_every", 1) or 0), first_step=self.state.step + 1)
        self.strategy.on_grads_ready(timer.grads_ready)  # when its gradient sync starts, if the strategy can tell
        startup.mark("loop_start")
        if writer is not None and self.resumed_from is not None:
            writer.resume_at(self.state.step)  # the interrupted attempt's later points are superseded
        s = self.state
        window = s.window_loss[ctx.rank] if s.logged_step is not None and ctx.rank < len(s.window_loss) else 0.0
        self.extras = task_metrics.Sums(ctx.device)
        return Loop(meter, profiler, writer, progress, torch.tensor(window, device=ctx.device),
                    s.step if s.logged_step is None else s.logged_step, self.extras,
                    start_step=s.step, start_unix=startup.marked("loop_start"), timer=timer)

    def micro_step(self, batches: Batches, loop: Loop, *, first: bool, last: bool,
                   check: Callable[[], None] = micro_fit.no_check) -> None:
        """Forward and backward of one micro-batch; the strategy synchronises gradients on the ``last`` one only.
        ``check``: the ranks agree that none ran out of memory, after the forward and after the backward."""
        device = self.ctx.device
        heartbeat.phase("data")
        x, y, wait = next(batches)
        faults.micro_batch(self.ctx.rank, len(x))
        heartbeat.phase("sync" if last else "forward_backward")
        loop.meter.add_wait(wait)
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        loop.timer.mark("data")
        if self.strategy.cudagraphs:  # a new micro-step: the previous replay's outputs may be reused
            torch.compiler.cudagraph_mark_step_begin()
        with self.strategy.sync(last):  # no_sync around forward *and* backward of every micro-step but the last
            with autocast(device, self.cfg.train.precision):
                loss, extra = task_metrics.split_output(self.strategy.forward(last)(x, y))
            check()
            scaled = loss / self.accumulation  # the mean over the step's equal micro-batches, at any split of them
            scaled = self.scaler.scale(scaled) if self.scaler is not None else scaled
            self.strategy.backward(scaled, first=first, last=last)
        check()
        loop.loss_sum += loss.detach().float()
        loop.extras.add(extra)
        self.state.micro_in_epoch += 1
        loop.timer.end_micro_step()

    def optimizer_step(self) -> tuple[float, torch.Tensor]:
        """Unscale (fp16), clip, step, advance the LR; returns the LR used and the grad norm (on the device)."""
        t = self.cfg.train
        params = self.strategy.params
        lr = self.optimizer.param_groups[0]["lr"]
        if self.scaler is not None:
            grad_norm = grad_sync.scaled_step(self.scaler, self.optimizer, params, t.grad_clip)
        else:  # every trained parameter has its gradient buffer (the strategy made them)
            grad_norm = grad_sync.clipped_step(self.optimizer, params, t.grad_clip)
        self.strategy.after_optimizer_step(self.optimizer, self.accumulation)
        self.scheduler.step()
        return lr, grad_norm

    def _after_first_step(self, loop: Loop) -> None:
        """The first step of this launch (step 1, or the first after a resume): time it, ready the save's
        buffers, and freeze what compilation left on the heap."""
        if self.ctx.device.type == "cuda":
            torch.cuda.synchronize()
        loop.first_step_end_unix = time.time()
        loop.first_step_s = loop.first_step_end_unix - float(os.environ.get(layout.ENV_T0, time.time()))
        if self.cfg.train.compile:
            _say(summary.compile_line(summary.compile_facts(self.cfg, self.compile_cache), loop.first_step_s))
        self.checkpoints.reserve()  # optimizer state exists now: get the save's buffers ready
        # Compilation leaves many long-lived Python objects; every full collection would walk them all and
        # stall this rank's host, and with DDP a stall on any rank stalls all. Frozen, they are not walked
        # again (torchtitan and Megatron manage the GC for the same reason). Measured: BENCHMARKS.md.
        with loop.meter.paused("gc", sync=False):  # the device was drained just above
            gc.collect()
            gc.freeze()

    def _finish_log(self, loop: Loop) -> None:
        log_step.close_log(loop, device=self.ctx.device, losses=self.state.losses,
                           unit=log_step.rate_unit(self.parts.tokens_per_sample))

    def close(self) -> None:
        """Finish the checkpoint in flight and stop DataLoader worker processes now, not at interpreter exit."""
        self.checkpoints.close()
        if self.telemetry is not None:
            self.telemetry.close()
        self.feed.close()  # persistent workers stop when their iterator is collected
        gc.collect()  # the LR lambda's closure makes a cycle through the trainer
