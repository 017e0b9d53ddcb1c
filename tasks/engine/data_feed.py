"""The training data of this rank: the sampler and loader, micro-batches epoch after epoch from where training
stands, the optimizer steps the run has, and a resumed launch's first micro-batch that settles the gradient
buckets."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from ddp_runner.tasks.engine.config import Config
from ddp_runner.tasks.engine.diagnostics import heartbeat
from ddp_runner.tasks.engine.rank import Context, autocast
from ddp_runner.tasks.engine.reporting import task_metrics
from ddp_runner.tasks.engine.sampler import ResumableDistributedSampler
from ddp_runner.tasks.engine.stop import signals
from ddp_runner.tasks.engine.strategy.base import Strategy
from ddp_runner.tasks.engine.train_state import TrainState

Batches = Iterator[tuple[torch.Tensor, torch.Tensor, float]]  # (x, y, seconds waited for them)


class DataFeed:
    """This rank's slice of the training set, in micro-batches of ``per_rank``, ``accumulation`` per step.

    ``by_step`` (``batch.per_rank=auto``): the loader hands out each optimizer step's samples as one chunk, split
    into micro-batches of the current size; :meth:`resize` changes the size, and can hand the current step's
    chunk out again from its start (a step retried at a smaller micro-batch sees the same samples).
    """

    def __init__(self, cfg: Config, ctx: Context, train_set: Dataset, per_rank: int, accumulation: int,
                 by_step: bool = False) -> None:
        self.cfg, self.per_rank, self.accumulation = cfg, per_rank, accumulation
        self.by_step, self._replay = by_step, False
        t = cfg.train
        # shuffle=True here, never in the DataLoader: the sampler shuffles by (seed, epoch) identically on every
        # rank and hands each rank its own slice.
        self.sampler = ResumableDistributedSampler(
            train_set, num_replicas=ctx.world_size, rank=ctx.rank, shuffle=True, seed=cfg.seed,
        )
        # drop_last keeps every micro-batch exactly batch.per_rank, so the global batch is what the plan says.
        # The loader draws its workers' base seed at every iter() from a generator of its own, seeded per epoch
        # (micro_batches): from the global RNG, that draw would put a resumed run's dropout one number behind.
        self.loader_rng = torch.Generator()
        # by_step: one optimizer step's samples at once, split into micro-batches (_split).
        self.loader: DataLoader | None = DataLoader(
            train_set, batch_size=per_rank * (accumulation if by_step else 1), sampler=self.sampler, drop_last=True,
            num_workers=t.num_workers, pin_memory=ctx.device.type == "cuda",
            persistent_workers=t.num_workers > 0, worker_init_fn=signals.shield_loader_worker,
            generator=self.loader_rng,
        )
        self.steps_per_epoch = (self.sampler.num_samples // per_rank) // accumulation
        if self.steps_per_epoch == 0:
            raise ValueError(
                f"batch.accumulation={accumulation}: an epoch gives each rank only"
                f" {self.sampler.num_samples // per_rank} micro-batches, fewer than one optimizer step."
                " Fix: lower batch.accumulation, batch.per_rank or world_size, or use more data"
            )

    def total_steps(self, s: TrainState) -> int:
        """``train.max_steps``, or the steps done plus what is left of ``train.epochs`` from where training stands.

        Counted from the current position, not as epochs × steps per epoch: a run resumed from a checkpoint whose
        steps had another size (another per-rank batch or accumulation) still finishes exactly the epochs asked for.
        """
        t = self.cfg.train
        if t.max_steps:
            return t.max_steps
        left = (t.epochs - s.epoch) * self.steps_per_epoch * self.accumulation - s.micro_in_epoch
        return s.step + max(0, left) // self.accumulation

    def micro_batches(self, state: TrainState) -> Batches:
        """Yield (x, y, data_wait_s) forever, epoch after epoch, calling set_epoch every epoch; ``state``'s epoch
        and position in it advance as training consumes them."""
        assert self.loader is not None, "the feed is closed"
        while True:
            self.sampler.set_epoch(state.epoch)
            self.sampler.set_start(state.micro_in_epoch * self.per_rank)
            self.loader_rng.manual_seed(self.cfg.seed + state.epoch)
            it = iter(self.loader)
            # Counted anew every time: a resized micro-batch changes how many of them an epoch holds.
            while state.micro_in_epoch < self.steps_per_epoch * self.accumulation:
                t0 = time.perf_counter()
                x, y = next(it)
                if self.by_step:
                    yield from self._split(x, y, time.perf_counter() - t0)
                else:
                    yield x, y, time.perf_counter() - t0
            state.epoch += 1
            state.micro_in_epoch = 0

    def _split(self, x: torch.Tensor, y: torch.Tensor, wait: float) -> Batches:
        """One optimizer step's chunk in micro-batches of the current size, from its start again after a
        :meth:`resize` that replays it. Slices of one collated chunk hold the values separate micro-batches of the
        same samples would."""
        pos = 0
        while pos < len(x):
            n = self.per_rank
            yield x[pos:pos + n], y[pos:pos + n], wait
            wait = 0.0  # the chunk's wait is counted once
            pos, self._replay = (0 if self._replay else pos + n), False

    def resize(self, per_rank: int, replay: bool = False) -> None:
        """Split each step's samples into micro-batches of ``per_rank`` from now on (``by_step`` feeds only);
        ``replay``: hand the current step's samples out again from the first (the step is retried)."""
        assert self.by_step, "only a feed that hands out whole steps can change its micro-batch"
        self.accumulation = self.per_rank * self.accumulation // per_rank
        self.per_rank, self._replay = per_rank, replay

    def close(self) -> None:
        """Let the loader's persistent workers stop (they do when their iterator is collected)."""
        self.loader = None


def settle_buckets(batches: Batches, strategy: Strategy, ctx: Context, precision: str,
                   say: Callable[[str], Any]) -> Batches:
    """A resumed launch reduces its gradients in the buckets an uninterrupted run has at that step (the strategy's
    ``settle_buckets`` says why): a throw-away forward and backward of the next micro-batch, with this rank's RNG
    as it was after it. Returns the micro-batches, that one still first."""
    first = next(batches)
    x, y = (t.to(ctx.device, non_blocking=True) for t in first[:2])

    def sync_step() -> None:
        heartbeat.phase("sync")
        if strategy.cudagraphs:
            torch.compiler.cudagraph_mark_step_begin()
        with strategy.sync(True):
            with autocast(ctx.device, precision):
                loss, _ = task_metrics.split_output(strategy.forward(True)(x, y))
            strategy.backward(loss.float() * 0.0, first=True, last=True)

    cuda = [ctx.device.index or 0] if ctx.device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda, device_type="cuda"):
        if strategy.settle_buckets(sync_step) and ctx.is_main:
            say("resume: one throw-away forward and backward laid out the gradient buckets as the"
                " uninterrupted run has them")
    return itertools.chain([first], batches)
