"""``batch.per_rank=auto`` across two gloo ranks: one rank runs out of memory (the simulated fault above a size,
then in a backward after gradients were accumulated), both agree, drop the step and run the same samples again in
halved micro-batches; the step's gradients are those of micro-batches of that size given by hand, bit for bit (the
same random numbers drawn), and the next step takes the next samples."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from torch.utils.data import TensorDataset

from ddp_runner.tasks.engine.config import Config, batch_plan
from ddp_runner.tasks.engine.data_feed import DataFeed
from ddp_runner.tasks.engine.diagnostics import faults
from ddp_runner.tasks.engine.micro_fit import MicroFit
from ddp_runner.tasks.engine.rank import Context
from ddp_runner.tasks.engine.reporting import task_metrics
from ddp_runner.tasks.engine.train_state import TrainState
from tests.support.driver import cli_in_process
from tests.support.spawn import spawn

CFG = Config({"seed": 3, "train": {"num_workers": 0, "max_steps": 4, "epochs": None},
              "batch": {"per_rank": "auto", "accumulation": 1, "global": 16}})


def _data() -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(64, 3, generator=g), torch.randn(64, generator=g))


def _loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """A mean loss that draws random numbers, as dropout does: a retried step must draw the same ones."""
    return ((model(x * (torch.rand_like(x) > 0.3)).squeeze(-1) - y) ** 2).mean()


def _worker(rank: int, world: int, tmp: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=rank, world_size=world)
    try:
        ctx = Context(rank, rank, world, torch.device("cpu"), tmp, tmp, None)
        plan = batch_plan(CFG, world, start=8)  # the whole per-rank share of 8: one micro-step
        feed = DataFeed(CFG, ctx, _data(), plan.per_rank, plan.accumulation, by_step=True)
        state = TrainState()
        batches = feed.micro_batches(state)
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 1)
        params = list(model.parameters())
        loop = SimpleNamespace(loss_sum=torch.zeros(()), extras=task_metrics.Sums(ctx.device))
        fit = MicroFit(plan, "test", ctx, auto=True, resize=lambda p, replay: feed.resize(p.per_rank, replay))
        faults.use(faults.Faults(oom_above=(4, 1)))  # rank 1 alone runs out above 4 samples before the forward
        seen: list[torch.Tensor] = []

        def micro_step(*, first: bool, last: bool, check) -> None:
            x, y, _ = next(batches)
            faults.micro_batch(rank, len(x))
            seen.append(x.clone())
            loss = _loss(model, x, y)
            check()
            (loss / fit.plan.accumulation).backward()
            if rank == 1 and len(x) == 4 and last:  # and at 4 in the last backward, with gradients accumulated
                raise torch.OutOfMemoryError("simulated in the backward")
            check()
            loop.loss_sum += loss.detach()
            state.micro_in_epoch += 1

        rng = torch.get_rng_state()
        fit.step(micro_step, state, loop, params)
        grads, first_loss_sum = [p.grad.clone() for p in params], loop.loss_sum.clone()
        # By hand: the first chunk of this rank's samples in micro-batches of 2.
        sampler_order = list(feed.sampler)[:8]
        x_all, y_all = _data()[sampler_order]
        model.zero_grad()
        torch.set_rng_state(rng)
        hand_loss = torch.zeros(())
        for i in range(0, 8, 2):
            loss = _loss(model, x_all[i:i + 2], y_all[i:i + 2])
            (loss / 4).backward()
            hand_loss += loss.detach()
        same = all(torch.equal(a, p.grad) for a, p in zip(grads, params, strict=True))
        retried = torch.cat(seen[-4:])
        state.step += 1
        model.zero_grad()
        fit.step(micro_step, state, loop, params)  # the next step: the next 8 samples, no retry
        torch.save({"same_grads": same, "same_losses": torch.equal(first_loss_sum, hand_loss),
                    "retried_is_chunk": torch.equal(retried, x_all),
                    "next_is_next": torch.equal(torch.cat(seen[-4:]), _data()[list(feed.sampler)[8:16]][0]),
                    "plan": (fit.plan.per_rank, fit.plan.accumulation), "micro_in_epoch": state.micro_in_epoch,
                    "record": fit.record()}, f"{tmp}/out-{rank}.pt")
        faults.use(faults.Faults(oom_above=(0, None)))  # not even one sample fits: the error is real
        with pytest.raises(torch.OutOfMemoryError, match="out of memory at micro-batch 1"):
            state.step = 0
            one = MicroFit(batch_plan(CFG, world, start=1), "test", ctx, auto=True, resize=lambda p, r: None)
            one.step(micro_step, state, loop, params)
    finally:
        faults.use(faults.Faults())
        dist.destroy_process_group()


def test_an_out_of_memory_error_on_one_rank_halves_every_rank_on_the_same_samples(tmp_path: Path):
    spawn(_worker, args=(2, str(tmp_path)))
    out = [torch.load(tmp_path / f"out-{r}.pt", weights_only=False) for r in range(2)]
    for o in out:
        assert o["same_grads"], "the retried step's gradients are the hand-split step's, bit for bit"
        assert o["same_losses"], "the logged loss sums the retried micro-batches only"
        assert o["retried_is_chunk"], "the retried step saw the same samples, in order"
        assert o["next_is_next"], "the next step took the next samples: nothing lost or seen twice"
        assert o["plan"] == (2, 4) and o["micro_in_epoch"] == 8  # two steps of 4 micro-batches of 2
        rec = o["record"]
        assert (rec["start"], rec["chosen"], rec["accumulation"], rec["per_rank_share"]) == (8, 2, 4, 8)
        assert rec["out_of_memory"] == [{"micro_batch": 8, "step": 1}, {"micro_batch": 4, "step": 1}]
    # Rank 0 never ran out itself: it halved because it agreed with rank 1.
    assert out[0]["record"] == out[1]["record"]


def test_auto_without_a_fixed_global_batch_is_refused_before_launch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    for extra, problem in (([], "batch.global is not set"), (["batch.global=15"], "not divisible by world_size=2")):
        r = cli_in_process(["task=smoke", "device=cpu", "world_size=2", "batch.per_rank=auto", *extra], tmp_path,
                           monkeypatch)
        assert r.returncode == 2, r.stdout + r.stderr
        assert "batch.per_rank='auto'" in r.stderr and problem in r.stderr
    assert not list(tmp_path.rglob("run.json"))  # nothing was created
    r = cli_in_process(["task=smoke", "device=cpu", "world_size=2", "batch.per_rank=auto", "batch.global=16",
                        "dry_run=true"], tmp_path, monkeypatch)
    assert r.returncode == 0 and "batch.per_rank=auto: starting at 8" in r.stdout
    assert "mode: auto" in r.stdout and "per_rank_share: 8" in r.stdout


def _late_worker(rank: int, world: int, tmp: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=rank, world_size=world)
    try:
        ctx = Context(rank, rank, world, torch.device("cpu"), tmp, tmp, None)
        plan = batch_plan(CFG, world, start=16)
        feed = DataFeed(CFG, ctx, _data(), plan.per_rank, plan.accumulation, by_step=True)
        state = TrainState()
        batches = feed.micro_batches(state)
        model = torch.nn.Linear(3, 1)
        loop = SimpleNamespace(loss_sum=torch.zeros(()), extras=task_metrics.Sums(ctx.device))
        fit = MicroFit(plan, "test", ctx, auto=True, resize=lambda p, replay: feed.resize(p.per_rank, replay))
        losses: list[torch.Tensor] = []
        out_of_memory_at = {2, 4}  # optimizer steps whose micro-batches of 16 run out (step 4: after the fitting)

        def micro_step(*, first: bool, last: bool, check) -> None:
            x, y, _ = next(batches)
            if state.step + 1 in out_of_memory_at and len(x) == 16:
                raise torch.OutOfMemoryError(f"simulated at step {state.step + 1}")
            loss = _loss(model, x, y)
            check()
            (loss / fit.plan.accumulation).backward()
            check()
            loop.loss_sum += loss.detach()
            losses.append(loss.detach())
            state.micro_in_epoch += 1

        for _ in range(3):  # steps 1-3 may halve; step 2 does, with step 1's loss still in the logging window
            fit.step(micro_step, state, loop, list(model.parameters()))
            state.step += 1
        # The window's mean as the log step takes it: loss_sum / accumulation / steps.
        window_mean = loop.loss_sum / fit.plan.accumulation / 3
        by_hand = (losses[0] + (losses[1] + losses[2]) / 2 + (losses[3] + losses[4]) / 2) / 3
        out_of_memory_at.add(4)
        fit.plan = batch_plan(CFG, world, start=16)  # as if it had never halved: step 4 is past the fitting
        feed.resize(16)
        with pytest.raises(torch.OutOfMemoryError, match="simulated at step 4"):
            fit.step(micro_step, state, loop, list(model.parameters()))
        torch.save({"window": torch.allclose(window_mean, by_hand, rtol=1e-6, atol=0),
                    "record": fit.record()}, f"{tmp}/out-{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_a_later_halving_counts_the_window_in_the_new_size_and_past_the_fitting_the_error_is_real(tmp_path: Path):
    spawn(_late_worker, args=(1, str(tmp_path)), nprocs=1)
    out = torch.load(tmp_path / "out-0.pt", weights_only=False)
    assert out["window"], "the logging window's mean counts step 1's single micro-batch as two of the new size"
    assert out["record"]["out_of_memory"] == [{"micro_batch": 16, "step": 2}]
