"""Guards against bugs the rest of the suite cannot see, because it compares two runs of the same code.

Here the engine is checked against an independent reference instead: the data order against what
``torch.utils.data.DistributedSampler`` itself yields for (seed, epoch, rank); the RNG state after a resume
against the one saved in the checkpoint. (End-to-end guards: tests/test_guards_e2e.py.)
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from torch.utils.data import DistributedSampler

from ddp_runner.tasks.engine.config import Config
from ddp_runner.tasks.engine.rank import Context
from ddp_runner.tasks.engine.trainer import Trainer

CONF_DIR = str(Path(__file__).resolve().parents[2] / "conf")


def _config(*overrides: str) -> Config:
    """The config a worker reads from its run directory, composed here from the repository's conf/."""
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        cfg = compose(config_name="config", overrides=["device=cpu", "backend=gloo", *overrides])
    return Config(OmegaConf.to_container(cfg, resolve=True))


@pytest.fixture
def gloo_group(tmp_path: Path) -> Iterator[None]:
    """A one-process gloo group in this process (the Trainer's DDP set-up needs a default group)."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


# -- 1. the sampler's epoch advances ------------------------------------------------------------------------


def _engine_order(cfg: Config, rank: int, world: int, run_dir: Path, epochs: int) -> list[list[int]]:
    """The dataset indices the engine's micro-steps consumed on ``rank`` of ``world``, per epoch.

    The Trainer's sampler and DataLoader are real; only the process group is a one-process one (the sampler
    takes its rank and world size from the Context, not from the group). Every micro-step of ``epochs`` epochs is
    run through ``Trainer.micro_step``, as ``train()`` runs them; the smoke samples' inputs identify them.
    """
    ctx = Context(rank, rank, world, torch.device("cpu"), str(run_dir), str(run_dir), None)
    trainer = Trainer(cfg, ctx)
    data = trainer.parts.train_set
    index_of = {data[i][0].numpy().tobytes(): i for i in range(len(data))}
    assert len(index_of) == len(data), "every smoke sample is distinct"
    seen: list[tuple[int, list[int]]] = []
    source = trainer.feed.micro_batches(trainer.state)

    def recording() -> Iterator[Any]:
        for x, y, wait in source:
            seen.append((trainer.state.epoch, [index_of[row.numpy().tobytes()] for row in x]))
            yield x, y, wait

    batches, loop = recording(), trainer._start_loop()
    acc = trainer.accumulation
    for _ in range(epochs * trainer.feed.steps_per_epoch):
        for m in range(acc):
            trainer.micro_step(batches, loop, first=m == 0, last=m == acc - 1)
    trainer.close()
    return [[i for e, batch in seen if e == epoch for i in batch] for epoch in range(epochs)]


def _reference_order(n: int, world: int, rank: int, seed: int, epoch: int, used: int) -> list[int]:
    """What torch's own DistributedSampler yields for (seed, epoch, rank): the first ``used`` of this rank's share."""
    sampler = DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=True, seed=seed)
    sampler.set_epoch(epoch)
    return list(sampler)[:used]


@pytest.mark.parametrize("world", [1, 2])
def test_each_epoch_reshuffles_as_distributed_sampler_does(world: int, gloo_group: None, tmp_path: Path) -> None:
    """Guards against the epoch never reaching the sampler (``set_epoch`` not called, or always with 0): every
    epoch would then repeat epoch 0's order. Comparing two runs of the engine cannot see that; torch's sampler can.
    """
    # 37 samples do not divide by 2 (the sampler pads) and 4 per rank × accumulation 2 leave samples unused at the
    # end of every epoch (drop_last, whole optimizer steps only): the order must still be torch's, prefix by prefix.
    n, seed, per_rank, acc, epochs = 37, 11, 4, 2, 3
    cfg = _config("task=smoke", f"data.num_samples={n}", f"seed={seed}", f"batch.per_rank={per_rank}",
                  f"batch.accumulation={acc}", "checkpoint.async_save=false", "train.num_workers=0")
    share = -(-n // world)
    used = (share // per_rank // acc) * acc * per_rank
    for rank in range(world):
        orders = _engine_order(cfg, rank, world, tmp_path, epochs)
        for epoch, order in enumerate(orders):
            assert order == _reference_order(n, world, rank, seed, epoch, used), f"rank {rank} epoch {epoch}"
        assert len({tuple(o) for o in orders}) == epochs, f"rank {rank}: every epoch has its own order"


# -- 3. a resume restores the RNG state ---------------------------------------------------------------------


def test_resume_restores_the_rng_state_the_checkpoint_saved(gloo_group: None, tmp_path: Path) -> None:
    """Guards against ``maybe_resume`` not restoring the rank's RNG state (``set_rng_state`` skipped): a resumed
    run would draw (dropout masks, random augmentation) from the fresh start-up seed instead of where the
    interrupted run was. torch, Python and numpy streams are all checked, right after the resume."""
    cfg = _config("task=smoke", "checkpoint.async_save=false", "resume=auto")
    ctx = Context(0, 0, 1, torch.device("cpu"), str(tmp_path), str(tmp_path), None)
    first = Trainer(cfg, ctx)
    # The interrupted run drew from every stream.
    torch.rand(5)
    random.random()
    np.random.rand(3)
    first.state.step = 3
    saved = torch.get_rng_state(), random.getstate(), np.random.get_state()
    first.checkpoint()
    first.close()
    resumed = Trainer(cfg, ctx)  # re-seeds as every start does; resume=auto takes the run's own checkpoint
    assert not torch.equal(torch.get_rng_state(), saved[0]), "start-up re-seeded: the check below means something"
    random.seed(0)
    np.random.seed(0)
    resumed.maybe_resume()
    resumed.close()
    assert resumed.resumed_from is not None and resumed.resumed_from.endswith("step_3")
    assert torch.equal(torch.get_rng_state(), saved[0]), "torch CPU generator"
    assert random.getstate() == saved[1], "python random"
    np_now = np.random.get_state()
    assert np_now[0] == saved[2][0] and np.array_equal(np_now[1], saved[2][1]) and np_now[2:] == saved[2][2:], \
        "numpy global generator"
