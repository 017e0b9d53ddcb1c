"""``batch.per_rank=auto``: the largest micro-batch that fits this rank's device, the global batch unchanged.

The driver picks the start (the largest divisor of the per-rank share ``batch.global / world_size`` whose memory
estimate fits, or the whole share where nothing is estimated: run.json's ``plan.micro_batch``). In the first
:data:`FIT_STEPS` optimizer steps of a launch the ranks agree after every forward and every backward (an
all-reduce of a flag: a rank that failed in between calls it too, so the calls stay matched): when any rank ran
out of memory, every rank drops what the step had done (gradients, losses, its place in the data, its random
stream), frees the memory, halves the micro-batch to the next divisor of the share, and runs the same step again
on the same samples in more micro-batches. Each micro-batch's mean loss
is divided by the accumulation, so equal micro-batches of any size sum to the mean over the rank's share: the
retried step computes the step a run given the smaller micro-batch by hand computes.

Not covered: an out-of-memory error on some ranks only while the others are inside a collective of the step
(DDP's gradient all-reduce in the synchronising backward; fsdp's all-gathers): the run fails as it would without
auto. The peak of a step is at the start of its backward, where the agreement after the forward catches it.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import IO, Any

import torch
import torch.distributed as dist

from ddp_runner.tasks.engine.config import BatchPlan, Config, auto_micro_batch, batch_plan, largest_divisor
from ddp_runner.tasks.engine.config import read_manifest as read_run_manifest
from ddp_runner.tasks.engine.rank import Context
from ddp_runner.tasks.engine.train_state import TrainState

FIT_STEPS = 3  # optimizer steps of a launch that may still halve: the optimizer's state exists from the second


def no_check() -> None:
    """A micro-step's agreement outside the fitting steps: none."""


class PeerOutOfMemory(Exception):
    """Another rank ran out of memory in this step: this one drops the step too."""


def start_plan(cfg: Config, world_size: int, run_dir: str) -> tuple[BatchPlan, str]:
    """The launch's batch plan and why its micro-batch; under ``batch.per_rank=auto`` at the micro-batch the
    driver chose (run.json's ``plan.micro_batch``)."""
    if not auto_micro_batch(cfg):
        return batch_plan(cfg, world_size), "batch.per_rank"
    recorded = (read_run_manifest(run_dir).get("plan") or {}).get("micro_batch") or {}
    plan = batch_plan(cfg, world_size, recorded.get("start"))
    return plan, str(recorded.get("why") or "the whole per-rank share")


@dataclass
class _Snapshot:
    """What a step changes before its optimizer step, as it was at the step's start."""

    micro_in_epoch: int
    loss_sum: torch.Tensor
    extras: tuple[torch.Tensor, float]
    rng: torch.Tensor
    cuda_rng: torch.Tensor | None


class MicroFit:
    """The micro-batch of this launch: fixed, or (``auto``) halved in the first steps until a step fits."""

    def __init__(self, plan: BatchPlan, why: str, ctx: Context, *, auto: bool,
                 resize: Callable[[BatchPlan, bool], None]) -> None:
        self.plan, self.why, self.auto, self.device = plan, why, auto, ctx.device
        self.console: IO[str] | None = ctx.console if ctx.is_main else None  # the user's, on rank 0
        self.share = plan.per_rank * plan.accumulation  # samples of one optimizer step on this rank
        self.start = plan.per_rank
        self.out_of_memory: list[dict[str, int]] = []  # each size that ran out, at which step
        self.earlier: list[dict[str, int]] = []  # the same, of the launches before the checkpoint resumed from
        # ``resize(plan, replay)``: the trainer's feed, loop and checkpoints take a new micro-batch (``replay``: the
        # feed hands the current step's samples out again); ``_until``: the step the fitting ends before (set when
        # the launch's loop runs its first step).
        self._resize, self._until = resize, None
        # The agreement's flag, allocated before any step: a device out of memory may not give even 4 bytes.
        self._flag = torch.zeros(1, device=ctx.device) if auto else None

    def resumed(self, their_plan: dict[str, Any], their_record: dict[str, Any] | None = None) -> None:
        """Before a resume counts its place in this launch's micro-batches: keep the micro-batch the checkpoint's
        run had settled on (still halved here if this device has less memory), when it divides this launch's
        share; and the sizes that ran out of memory before the checkpoint (``their_record``: its ``micro_batch``),
        so that the record stays whole across launches."""
        if not self.auto:
            return
        self.earlier = [dict(o) for o in (their_record or {}).get("out_of_memory") or []]
        theirs = their_plan.get("per_rank_batch")
        if isinstance(theirs, int) and self.share % theirs == 0 and theirs < self.plan.per_rank:
            self.why = f"the checkpoint's micro-batch ({theirs}), kept on resume"
            self.start = theirs
            self._set(theirs, None, replay=False)
            self._say(f"batch.per_rank=auto: the resume keeps the checkpoint's micro-batch {theirs} ×"
                      f" {self.plan.accumulation} accumulation (halved again if it runs out of memory here)")

    def step(self, micro_step: Callable[..., None], state: TrainState, loop: Any, params: list[torch.Tensor]) -> None:
        """Run the next optimizer step's micro-steps (``micro_step(first=, last=, check=)``, which calls ``check``
        after its forward and after its backward); while fitting, on an out-of-memory error on any rank, the step
        again at half the micro-batch."""
        if self._until is None:  # the launch's first step: this and the next FIT_STEPS - 1 may halve
            self._until = state.step + FIT_STEPS if self.auto else 0
            loop.micro_batch = self.plan.per_rank if self.auto else None  # logged with every step (batch/micro)
        if state.step >= self._until:
            self._micro_steps(micro_step, no_check)
            return
        while True:
            saved = self._snapshot(state, loop)
            try:
                self._micro_steps(micro_step, self._check)  # the last check follows the last backward: all got through
                return
            except torch.OutOfMemoryError:
                own = True
            except PeerOutOfMemory:
                own = False
            # Out of the except block the error's frames are gone: what the failed step held can be freed.
            gc.collect()
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            if own:
                self._agree(failed=True)  # matches the others' next check: they drop the step too
            self._retry(saved, state, loop, params, own)

    def _micro_steps(self, micro_step: Callable[..., None], check: Callable[[], None]) -> None:
        n = self.plan.accumulation
        for m in range(n):
            micro_step(first=m == 0, last=m == n - 1, check=check)

    def _check(self) -> None:
        if self._agree(failed=False):
            raise PeerOutOfMemory

    def _agree(self, failed: bool) -> bool:
        """Whether any rank ran out of memory since the last agreement (a collective: every rank calls it)."""
        assert self._flag is not None, "only an auto micro-batch agrees"
        self._flag.fill_(1.0 if failed else 0.0)
        dist.all_reduce(self._flag, op=dist.ReduceOp.MAX)
        return bool(self._flag.item())

    def _retry(self, saved: _Snapshot, state: TrainState, loop: Any, params: list[torch.Tensor], own: bool) -> None:
        """Undo the step and halve the micro-batch (refused below 1: the error is real)."""
        size = self.plan.per_rank
        if size == 1:
            raise torch.OutOfMemoryError(
                f"batch.per_rank=auto: out of memory at micro-batch 1 at step {state.step + 1}"
                f" ({'this rank' if own else 'another rank'}). Fix: strategy=fsdp or zero1, a lower precision, or a"
                " smaller model")
        self._restore(saved, state, loop, params)
        old = self.plan.accumulation
        smaller = largest_divisor(self.share, size // 2)
        self.out_of_memory.append({"micro_batch": size, "step": state.step + 1})
        self._set(smaller, state, replay=True)
        loop.micro_batch = smaller
        # The logging window's earlier steps summed fewer, larger micro-batches: counted in the new ones.
        ratio = self.plan.accumulation / old
        loop.loss_sum.mul_(ratio)
        loop.extras.sums, loop.extras.weight = loop.extras.sums * ratio, loop.extras.weight * ratio
        self._say(f"batch.per_rank=auto: micro-batch {size} ran out of memory at step {state.step + 1}"
                  f" ({'this rank' if own else 'another rank'}); the step runs again at {smaller} ×"
                  f" {self.plan.accumulation} accumulation, global batch {self.plan.global_batch} unchanged")

    def _set(self, size: int, state: TrainState | None, replay: bool) -> None:
        """Micro-batches of ``size`` from now on: ``state``'s place in the epoch is counted in them (a step
        boundary, so a whole number of them)."""
        if state is not None:
            state.micro_in_epoch = state.micro_in_epoch * self.plan.per_rank // size
        self.plan = replace(self.plan, per_rank=size, accumulation=self.share // size)
        self._resize(self.plan, replay)

    def _snapshot(self, state: TrainState, loop: Any) -> _Snapshot:
        cuda = torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else None
        return _Snapshot(state.micro_in_epoch, loop.loss_sum.clone(), (loop.extras.sums.clone(), loop.extras.weight),
                         torch.get_rng_state(), cuda)

    def _restore(self, saved: _Snapshot, state: TrainState, loop: Any, params: list[torch.Tensor]) -> None:
        state.micro_in_epoch = saved.micro_in_epoch
        loop.loss_sum.copy_(saved.loss_sum)
        loop.extras.sums, loop.extras.weight = saved.extras
        torch.set_rng_state(saved.rng)  # the retried step draws the random numbers (dropout) the first did
        if saved.cuda_rng is not None:
            torch.cuda.set_rng_state(saved.cuda_rng, self.device)
        grads = [p.grad for p in params if p.grad is not None]
        if grads:  # what the dropped micro-steps accumulated
            torch._foreach_zero_(grads)

    def _say(self, line: str) -> None:
        print(line, flush=True)  # the rank's log
        if self.console is not None:
            print(f"ddp-run: {line}", file=self.console, flush=True)

    def record(self) -> dict[str, Any] | None:
        """summary.json's, run.json's and a checkpoint's ``micro_batch`` (None: the micro-batch was given): the size
        the ranks settled on, where this launch started, why, and each size that ran out of memory (in the launches
        before the checkpoint this one resumed from too)."""
        if not self.auto:
            return None
        why = self.why + ("" if not self.out_of_memory else "; halved after out-of-memory errors at "
                          + ", ".join(f"{o['micro_batch']} (step {o['step']})" for o in self.out_of_memory))
        return {"mode": "auto", "per_rank_share": self.share, "start": self.start, "chosen": self.plan.per_rank,
                "accumulation": self.plan.accumulation, "out_of_memory": self.earlier + self.out_of_memory,
                "why": why}
