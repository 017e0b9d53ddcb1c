"""``batch.per_rank=auto``, the pure parts: the plan's refusals and start, the memory plan's start, the workers'
batch plan, the feed's split of a step into micro-batches, the simulated fault, and run.json's fitted plan."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from torch.utils.data import TensorDataset

from ddp_runner.config import memory_plan as mp
from ddp_runner.config import validate
from ddp_runner.config.plan import Gpu, make_plan
from ddp_runner.contract.errors import PlanError
from ddp_runner.supervise.finalize import fitted_plan
from ddp_runner.tasks.engine.config import Config, batch_plan, largest_divisor
from ddp_runner.tasks.engine.data_feed import DataFeed
from ddp_runner.tasks.engine.diagnostics import faults
from ddp_runner.tasks.engine.micro_fit import MicroFit
from ddp_runner.tasks.engine.train_state import TrainState

GPU = Gpu(0, "NVIDIA H200", "GPU-aaa")
ARCH = {"layers": 24, "width": 1024, "heads": 16, "context": 1024, "vocab": 50304, "loss": "fused"}
MEDIUM = mp.ModelFacts(params=354_000_000, largest_unit=12_600_000, root=52_000_000, arch=ARCH)


def cfg(**over):
    """A composed config's keys the plan reads (``a__b=v`` sets ``a.b``)."""
    base = {
        "world_size": 2, "batch": {"per_rank": 8, "accumulation": 1, "global": None},
        "device": "cpu", "backend": "auto", "task": {"name": "smoke"}, "launcher": {"nnodes": 1},
        "train": {"precision": "fp32", "max_steps": 4, "epochs": None, "optimizer": "sgd", "schedule": "constant"},
    }
    for dotted, value in over.items():
        *parents, leaf = dotted.split("__")
        node = base
        for p in parents:
            node = node[p]
        node[leaf] = value
    return base


def auto(**over):
    return cfg(batch__per_rank="auto", **over)


def test_auto_needs_a_global_batch_the_ranks_share_equally():
    with pytest.raises(PlanError) as e:
        make_plan(auto(), [])
    assert e.value.key == "batch.per_rank" and "batch.global is not set" in e.value.problem
    with pytest.raises(PlanError) as e:
        make_plan(auto(batch__global=33), [])  # 2 ranks
    assert e.value.key == "batch.per_rank" and "not divisible by world_size=2" in e.value.problem
    assert "batch.global=32 or 34" in e.value.fix


def test_auto_starts_from_the_whole_share_and_says_why():
    plan = make_plan(auto(batch__global=32), [])
    assert (plan.per_rank_batch, plan.accumulation, plan.global_batch) == (16, 1, 32)
    rec = plan.to_manifest()["micro_batch"]
    assert rec["mode"] == "auto" and rec["per_rank_share"] == 16 and rec["start"] == 16 and "no memory" in rec["why"]
    assert make_plan(cfg(), []).micro_batch is None  # a given micro-batch records none


def test_the_key_accepts_auto_and_nothing_else_but_numbers():
    validate.check_engine(auto(batch__global=32))
    with pytest.raises(PlanError) as e:
        validate.check_engine(cfg(batch__per_rank="max"))
    assert e.value.key == "batch.per_rank"


def test_the_memory_plan_starts_at_the_largest_divisor_that_fits():
    conf = {"train": {"precision": "bf16"}, "strategy": {"name": "ddp"}}
    plan = make_plan(auto(batch__global=48, world_size=1, device="cuda"), [GPU])
    at = {b: mp.estimate(MEDIUM, "ddp", world_size=1, per_rank=b, accumulation=48 // b, precision="bf16")["total_gb"]
          for b in (12, 16, 24)}
    cap = (at[16] + at[24]) / 2 / mp.HEADROOM  # 16 fits with the headroom, 24 does not
    start = mp.auto_start(MEDIUM, conf, plan, "ddp", cap, "a test cap")
    assert (start.per_rank_batch, start.accumulation, start.global_batch) == (16, 3, 48)
    assert start.micro_batch["start"] == 16 and "fits 85% of the" in start.micro_batch["why"]
    assert mp.with_start(plan, {"auto_micro_batch": start.micro_batch}) == start
    assert mp.with_start(plan, None) is plan
    tiny = mp.auto_start(MEDIUM, conf, plan, "ddp", 1.0, "a test cap")  # nothing fits: the smallest, and decide
    assert tiny.per_rank_batch == 1 and "the smallest" in tiny.micro_batch["why"]
    assert mp.auto_start(MEDIUM, conf, plan, "ddp", None, "no limit") is plan


def test_the_workers_split_the_share_by_the_start_or_the_largest_divisor_below_it():
    c = Config(auto(batch__global=48))
    assert batch_plan(c, 2, start=8).as_dict() == {"world_size": 2, "per_rank_batch": 8, "accumulation": 3,
                                                  "global_batch": 48}
    assert batch_plan(c, 2).per_rank == 24  # no start: the whole share
    assert batch_plan(c, 3, start=10).per_rank == 8  # another world: 16 per rank, 8 divides it
    assert [largest_divisor(12, n) for n in (12, 6, 5, 3, 1, 0)] == [12, 6, 4, 3, 1, 1]
    assert batch_plan(Config(cfg(batch__accumulation=2)), 2).as_dict()["per_rank_batch"] == 8  # given: as given


def _feed(per_rank: int, accumulation: int, by_step: bool) -> tuple[DataFeed, TrainState]:
    conf = Config({"seed": 1, "train": {"num_workers": 0, "max_steps": 3, "epochs": None}})
    ctx = SimpleNamespace(world_size=1, rank=0, device=torch.device("cpu"))
    data = TensorDataset(torch.arange(24).float(), torch.arange(24))
    return DataFeed(conf, ctx, data, per_rank, accumulation, by_step=by_step), TrainState()


def test_a_step_split_by_the_feed_is_the_micro_batches_given_by_hand_and_replays_from_its_start():
    by_hand, s1 = _feed(2, 4, by_step=False)
    by_step, s2 = _feed(8, 1, by_step=True)
    hand, step = by_hand.micro_batches(s1), by_step.micro_batches(s2)
    first = next(step)[0]
    assert len(first) == 8
    by_step.resize(2, replay=True)  # the step is retried at 2: the same samples again, from the first
    assert by_step.accumulation == 4
    for _ in range(8):  # two steps of 4 micro-batches
        a, b = next(hand)[0], next(step)[0]
        assert torch.equal(a, b)
        s1.micro_in_epoch += 1
        s2.micro_in_epoch += 1
    with pytest.raises(AssertionError):
        by_hand.resize(1)  # a feed of given micro-batches keeps them


def test_the_simulated_fault_strikes_above_its_size_on_its_rank():
    try:
        faults.use(faults.Faults.from_env({faults.ENV_OOM_ABOVE: "4@1"}))
        faults.micro_batch(0, 16)  # another rank
        faults.micro_batch(1, 4)  # not above
        with pytest.raises(torch.OutOfMemoryError, match="micro-batch of 8 samples on rank 1"):
            faults.micro_batch(1, 8)
        faults.use(faults.Faults.from_env({faults.ENV_OOM_ABOVE: "4"}))
        with pytest.raises(torch.OutOfMemoryError):
            faults.micro_batch(0, 5)
    finally:
        faults.use(faults.Faults())


def test_run_json_records_the_micro_batch_the_ranks_settled_on():
    plan = {"world_size": 2, "per_rank_batch": 8, "accumulation": 1, "global_batch": 16, "explanation": "x"}
    fitted = {"mode": "auto", "chosen": 2, "accumulation": 4, "start": 8, "why": "w"}
    out = fitted_plan(plan, fitted)
    assert (out["per_rank_batch"], out["accumulation"], out["micro_batch"]) == (2, 4, fitted)
    assert out["explanation"] == "global batch 16 = 2 per rank × 2 ranks × 4 accumulation"
    assert fitted_plan(plan, None) is plan


def test_a_resume_keeps_the_micro_batch_the_checkpoints_run_settled_on(capsys: pytest.CaptureFixture[str]):
    ctx = SimpleNamespace(device=torch.device("cpu"), console=None, is_main=True)
    told: list[tuple[int, bool]] = []
    c = Config(auto(batch__global=32))
    fit = MicroFit(batch_plan(c, 2, start=16), "w", ctx, auto=True, resize=lambda p, r: told.append((p.per_rank, r)))
    fit.resumed({"per_rank_batch": 3})  # does not divide the share of 16: the start stays
    fit.resumed({"per_rank_batch": 4, "accumulation": 4})
    assert (fit.plan.per_rank, fit.plan.accumulation, told) == (4, 4, [(4, False)])  # no replay: no step yet
    assert fit.record()["start"] == 4 and "kept on resume" in fit.record()["why"]
    assert "the resume keeps the checkpoint's micro-batch 4 × 4 accumulation" in capsys.readouterr().out
    given = MicroFit(batch_plan(Config(cfg()), 2), "w", ctx, auto=False, resize=lambda p, r: told.append(p))
    given.resumed({"per_rank_batch": 4})
    assert given.plan.per_rank == 8 and given.record() is None and len(told) == 1  # a given micro-batch stays


class _Wandb:
    """Stands for ``WandbLog``: keeps the parameters it was opened with."""

    name, opened = "wandb", {}

    def __init__(self, record: dict, config: dict, run_name: str) -> None:
        _Wandb.opened = config

    def log(self, scalars: dict, step: int) -> None: ...
    def resume_at(self, step: int) -> None: ...
    def flush(self) -> None: ...
    def close(self) -> None: ...


def test_wandb_parameters_hold_the_plan_the_driver_started_at(tmp_path, monkeypatch: pytest.MonkeyPatch):
    """Not the whole share: the start in run.json, as MLflow's parameters (the driver's) and TensorBoard's plan
    have it; the fitted size is the metric batch/micro."""
    from ddp_runner.tasks.engine.trackers import open as trackers_open
    from ddp_runner.tasks.engine.trackers import wandb_log

    monkeypatch.setattr(wandb_log, "WandbLog", _Wandb)
    monkeypatch.setenv("WORLD_SIZE", "2")
    (tmp_path / "run.json").write_text(json.dumps({"plan": {"micro_batch": {"mode": "auto", "start": 4}},
                                                   "trackers": {"wandb": {"id": "x", "project": "p"}}}))
    opened = trackers_open.open_trackers(Config(auto(batch__global=32, logger={"wandb": {}})), str(tmp_path),
                                         str(tmp_path))
    opened.close()
    assert opened.names == [] and opened.closed == ["wandb"], opened.errors
    params = _Wandb.opened
    assert (params["plan.per_rank_batch"], params["plan.accumulation"], params["batch.per_rank"]) == ("4", "4", "auto")
    assert params["plan.explanation"] == "global batch 32 = 4 per rank × 2 ranks × 4 accumulation"
