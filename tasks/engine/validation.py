"""Validation: when this rank validates (:meth:`Validator.should_validate`) and how (:func:`evaluate`: every
sample counted exactly once across ranks; a compiled model run compiled or eagerly, ``val_compile.py``)."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, Subset

from ddp_runner.tasks.api import TaskParts
from ddp_runner.tasks.engine import val_compile
from ddp_runner.tasks.engine.config import Config
from ddp_runner.tasks.engine.diagnostics import heartbeat
from ddp_runner.tasks.engine.rank import Context, autocast
from ddp_runner.tasks.engine.reporting import task_metrics
from ddp_runner.tasks.engine.reporting.progress import Progress
from ddp_runner.tasks.engine.stop.vote import StopAgreed, StopAgreement

Phase = Callable[[str], contextlib.AbstractContextManager]  # the trainer's phase(name): heartbeat, meter, fault hook


@torch.no_grad()
def evaluate(model: torch.nn.Module, data: Dataset, ctx: Context, batch: int, precision: str,
             lockstep: bool = False, metrics: dict[str, float] | None = None,
             names: tuple[str, ...] | None = None, compile_mode: str = "compiled",
             stop: Callable[[], int] | None = None) -> float:
    """Mean loss over the whole dataset, each sample counted exactly once across ranks.

    ``metrics``: filled with the task's extra metrics (``names``, the same on every rank) over the same samples,
    each batch weighted by its size, reduced in the loss's own all-reduce.

    DistributedSampler pads uneven splits with duplicates; here rank r takes samples r, r+W, r+2W, … with
    no padding, and the sums and counts are reduced across ranks. ``lockstep``: every forward is a collective
    (a sharded model gathers its parameters), so a rank with fewer batches runs extra forwards that count zero.
    ``compile_mode``: ``eager`` or ``compiled``, how a compiled model runs here (tasks/engine/val_compile.py).
    ``stop``: the stop vote (a collective), taken after every batch, as many times on every rank (rank 0's batch
    count, the largest); a stop it agrees on leaves the validation on every rank at that batch (``StopAgreed``).
    """
    was_training = model.training
    model.eval()
    shard = Subset(data, range(ctx.rank, len(data), ctx.world_size))
    totals = torch.zeros(2, dtype=torch.float64, device=ctx.device)
    sums = task_metrics.Sums(ctx.device, names if metrics is not None else ())
    most = math.ceil(math.ceil(len(data) / ctx.world_size) / batch)  # rank 0's batch count, the largest
    batches = iter(DataLoader(shard, batch_size=batch, shuffle=False))
    filler = next(iter(DataLoader(data, batch_size=1))) if lockstep else None
    try:
        for i in range(most):
            xy = next(batches, None)
            if xy is not None or lockstep:  # a rank out of batches runs the lockstep's forwards, counting zero
                x, y = xy if xy is not None else filler
                if compile_mode == "compiled":  # CUDA graphs (reduce-overhead): each batch is a new step of the tree
                    val_compile.mark_step()
                with val_compile.stance(compile_mode, first_batch=i == 0), autocast(ctx.device, precision):
                    loss, extra = task_metrics.split_output(model(x.to(ctx.device), y.to(ctx.device)))
            if xy is not None:
                totals[0] += loss.double() * len(x)
                totals[1] += len(x)
                sums.add({k: v for k, v in extra.items() if k in (sums.names or ())}, weight=len(x))
                heartbeat.tick()
            if stop is not None and (signum := stop()):
                raise StopAgreed(signum)
        totals = torch.cat([totals, sums.sums.double()])
        dist.all_reduce(totals)
    finally:
        model.train(was_training)
    if metrics is not None:
        metrics.update(zip(sums.names or (), (totals[2:] / totals[1]).tolist(), strict=True))
    return (totals[0] / totals[1]).item()


class Validator:
    """This run's validation: when it is due, running it, and what it found and cost (summary.json)."""

    def __init__(self, cfg: Config, ctx: Context, parts: TaskParts, model: torch.nn.Module, *, per_rank: int,
                 collective_forward: bool, total_steps: int, phase: Phase,
                 train_names: Callable[[], tuple[str, ...] | None]) -> None:
        self.cfg, self.ctx, self.parts, self.model, self.per_rank = cfg, ctx, parts, model, per_rank
        self.collective_forward, self.phase, self.train_names = collective_forward, phase, train_names
        # How validation runs the compiled model, and what each validation cost (summary.json "validation").
        self.facts: dict[str, Any] = {"compile_mode": "eager", "runs": 0, "seconds": 0.0, "last_s": None,
                                      "graphs_compiled": 0}
        self.plan(total_steps)
        self.loss: float | None = None      # the last validation's loss
        self.metrics: dict[str, float] = {}  # and its extra metrics (val/<name>)

    def plan(self, total_steps: int) -> None:
        """How the run validates a compiled model, given its steps (again after a resume changed them)."""
        t = self.cfg.train
        self.facts["compile_mode"] = val_compile.resolve(t.get("val_compile"), t.val_every, total_steps)

    @property
    def enabled(self) -> bool:
        """Whether the task has a validation set at all (then the run also validates once at its end)."""
        return self.parts.val_set is not None

    def should_validate(self, step: int, last_step: int) -> bool:
        """Whether optimizer step ``step`` ends with a periodic validation (the last step has the final one)."""
        every = self.cfg.train.val_every
        return self.enabled and bool(every) and step % every == 0 and step != last_step

    def summary(self) -> dict[str, Any] | None:
        """How often validation ran, its seconds and the graphs it compiled (None: it never ran)."""
        return dict(self.facts) if self.facts["runs"] else None

    def run(self, writer: Any, step: int, progress: Progress | None = None,
            stop: StopAgreement | None = None) -> float:
        """Exact validation loss (every sample once across ranks), logged at ``step`` and shown on the console;
        the task's extra metrics over the same samples go to :attr:`metrics` (``val/<name>``). ``stop``: the ranks'
        stop vote, taken after every batch; a stop it agrees on cuts the validation short (``StopAgreed``, nothing
        logged). The random generators are left as found (each data loader draws a seed from them): whether and
        where a run validates never changes its training, nor a checkpoint saved around a validation."""
        if progress is not None:
            progress.phase("validation")  # the driver's bar says so while it runs
        try:
            with self.phase("validation"):
                return self._run(writer, step, progress, stop)
        finally:
            if progress is not None:
                progress.phase(None)

    def _run(self, writer: Any, step: int, progress: Progress | None, stop: StopAgreement | None) -> float:
        data = self.parts.val_set
        cap = self.cfg.train.get("val_samples")
        if cap and cap < len(data):  # the same leading samples every time, each counted once
            data = Subset(data, range(cap))
        found: dict[str, float] = {}
        v, t0 = self.facts, time.perf_counter()
        # Ends with the loss on the host: the device's work is in the time.
        with val_compile.counting(v), torch.random.fork_rng(devices=[]):
            loss = evaluate(self.model, data, self.ctx, self.per_rank, self.cfg.train.precision,
                            lockstep=self.collective_forward, metrics=found, names=self._metric_names(data),
                            compile_mode=v["compile_mode"], stop=stop.poll if stop is not None else None)
        v["last_s"] = time.perf_counter() - t0
        v["runs"], v["seconds"] = v["runs"] + 1, v["seconds"] + v["last_s"]
        extra = task_metrics.named(tuple(found), list(found.values()), "val")
        if writer is not None:
            writer.log({"val/loss": loss, **extra, "time/validation_s": v["last_s"]}, step)
        print(f"step {step} val/loss {loss:.4f}" + "".join(f" {k} {val:.4g}" for k, val in extra.items()), flush=True)
        print(f"validation: {v['last_s']:.2f} s ({v['compile_mode']}; graphs compiled in validations so far:"
              f" {v['graphs_compiled']})", flush=True)
        if progress is not None:  # and on the user's console
            progress.validated(step, loss, extra)
        self.loss = loss
        self.metrics.update(extra)
        return loss

    def _metric_names(self, data: Dataset) -> tuple[str, ...]:
        """The task's extra metric names: from training, else from one forward on the first validation sample
        (every rank the same one, so a sharded model's forward stays collective)."""
        names = self.train_names()
        if names is None:
            x, y = next(iter(DataLoader(data, batch_size=1)))
            was_training = self.model.training
            self.model.eval()
            with torch.no_grad(), autocast(self.ctx.device, self.cfg.train.precision), \
                    val_compile.stance(self.facts["compile_mode"], first_batch=False):  # no batch-1 graph
                _, extra = task_metrics.split_output(self.model(x.to(self.ctx.device), y.to(self.ctx.device)))
            self.model.train(was_training)
            names = tuple(sorted(extra))
        return names
