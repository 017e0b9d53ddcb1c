"""The training engine's arithmetic on CPU: LR schedule, resumable sampler, exact distributed validation in a
real 2-process gloo group, and (through the CLI) accumulation/world-size equivalence at a fixed global batch.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from conftest import ddp_run, load_json, run_dirs
from torch.utils.data import Dataset

from tasks.engine import checkpoint as ckpt
from tasks.engine.optim import apply_inductor_settings, lr_factor
from tasks.engine.sampler import ResumableDistributedSampler
from tasks.engine.trainer import Context, evaluate
from tasks.gpt.data import TokenWindows
from tasks.gpt.model import GPT
from tasks.smoke import Regression, synthetic_dataset

# -- lr_factor ---------------------------------------------------------------------------------------------


def test_warmup_is_linear_up_to_the_base_lr():
    factors = [lr_factor(s, 100, "cosine", 4, 0.1) for s in range(4)]
    assert factors == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert [lr_factor(s, 100, "constant", 4, 0.1) for s in range(4)] == pytest.approx([0.25, 0.5, 0.75, 1.0])


def test_cosine_decays_from_one_to_min_ratio_and_stays_there():
    total, warmup, floor = 110, 10, 0.1
    assert lr_factor(warmup, total, "cosine", warmup, floor) == pytest.approx(1.0)
    assert lr_factor(warmup + 50, total, "cosine", warmup, floor) == pytest.approx((1 + floor) / 2)  # halfway
    assert lr_factor(total, total, "cosine", warmup, floor) == pytest.approx(floor)
    assert lr_factor(total + 500, total, "cosine", warmup, floor) == pytest.approx(floor)  # clamped past the end
    decay = [lr_factor(s, total, "cosine", warmup, floor) for s in range(warmup, total + 1)]
    assert all(a > b for a, b in zip(decay, decay[1:], strict=False)), "strictly decreasing"
    assert min(decay) >= floor
    # No warmup: the first step already runs at the base LR.
    assert lr_factor(0, 10, "cosine", 0, 0.0) == pytest.approx(1.0)
    assert lr_factor(10, 10, "cosine", 0, 0.0) == pytest.approx(0.0, abs=1e-12)


def test_constant_is_one_after_warmup():
    assert {lr_factor(s, 50, "constant", 0, 0.1) for s in range(60)} == {1.0}
    assert {lr_factor(s, 50, "constant", 5, 0.1) for s in range(5, 60)} == {1.0}


def test_unknown_schedule_is_refused_even_during_warmup():
    # LambdaLR evaluates step 0 at construction: a typo must fail there, not after the warmup.
    for step in (0, 3, 20):
        with pytest.raises(ValueError, match="train.schedule='linear'"):
            lr_factor(step, 100, "linear", 10, 0.1)


# -- ResumableDistributedSampler ---------------------------------------------------------------------------


def _order(n: int, world: int, rank: int, epoch: int, start: int = 0, seed: int = 7) -> list[int]:
    s = ResumableDistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=True, seed=seed)
    s.set_epoch(epoch)
    s.set_start(start)
    assert len(s) == s.num_samples - start
    return list(s)


@pytest.mark.parametrize(("n", "world"), [(13, 2), (64, 2), (10, 1), (9, 4)])
def test_skipping_start_reproduces_the_tail_of_the_same_epoch(n, world):
    for rank in range(world):
        full = _order(n, world, rank, epoch=3)
        for start in range(len(full) + 1):
            assert _order(n, world, rank, epoch=3, start=start) == full[start:]
    # Every sample is seen in an epoch (padding repeats a few when n does not divide by world).
    shares = [_order(n, world, r, epoch=3) for r in range(world)]
    assert set().union(*shares) == set(range(n))
    assert sum(len(s) for s in shares) == math.ceil(n / world) * world


def test_order_depends_only_on_seed_and_epoch():
    assert _order(64, 2, 0, epoch=0) == _order(64, 2, 0, epoch=0)  # a fresh sampler, same order
    assert _order(64, 2, 0, epoch=0) != _order(64, 2, 0, epoch=1)  # set_epoch reshuffles
    assert _order(64, 2, 0, epoch=0) != _order(64, 2, 0, epoch=0, seed=8)
    # Rank r takes r::W of one global permutation: world 2 interleaves exactly into world 1's order.
    one = _order(64, 1, 0, epoch=5)
    assert _order(64, 2, 0, epoch=5) == one[0::2] and _order(64, 2, 1, epoch=5) == one[1::2]


# -- evaluate: exact mean across ranks ---------------------------------------------------------------------

EVAL_LENGTHS = (1, 7, 13)  # 1 leaves rank 1 with nothing; 7 and 13 do not divide by 2


def _eval_cases(tmp: Path) -> dict[str, tuple[torch.nn.Module, Dataset]]:
    """The same models and datasets on every process: fixed seeds, a token file written once."""
    torch.manual_seed(0)
    cases: dict[str, tuple[torch.nn.Module, Dataset]] = {}
    for n in EVAL_LENGTHS:
        cases[f"regression{n}"] = (Regression(8, 1), synthetic_dataset(n, 8, 1, seed=n))
    gpt = GPT(vocab=32, context=8, width=16, layers=1, heads=2)
    tokens = tmp / "tokens.bin"
    if not tokens.exists():
        np.random.default_rng(0).integers(0, 32, size=13 * 8 + 1, dtype=np.uint16).tofile(tokens)
    cases["gpt13"] = (gpt, TokenWindows(str(tokens), "uint16", context=8, start=0, n_tokens=13 * 8 + 1))
    return cases


def _evaluate_all(tmp: Path, rank: int, world: int) -> dict[str, float]:
    ctx = Context(rank, rank, world, torch.device("cpu"), str(tmp), str(tmp), None)
    out = {}
    for name, (model, data) in _eval_cases(tmp).items():
        model.train()
        out[name] = evaluate(model, data, ctx, batch=2, precision="fp32")
        assert model.training, "evaluate restores train mode"
        model.eval()
        out[name + "/eval_mode_kept"] = evaluate(model, data, ctx, batch=2, precision="fp32")
        assert not model.training
    return out


def _eval_worker(rank: int, world: int, tmp: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{tmp}/store-{world}", rank=rank, world_size=world)
    try:
        torch.save(_evaluate_all(Path(tmp), rank, world), f"{tmp}/eval-{world}-{rank}.pt")
    finally:
        dist.destroy_process_group()


def _by_hand(model: torch.nn.Module, data: Dataset) -> float:
    """Mean per-sample loss, one sample at a time, summed in fp64."""
    with torch.no_grad():
        losses = [model(x[None], y[None]).double().item() for x, y in (data[i] for i in range(len(data)))]
    return sum(losses) / len(losses)


def test_evaluate_counts_every_sample_once_across_two_gloo_ranks(tmp_path):
    mp.spawn(_eval_worker, args=(2, str(tmp_path)), nprocs=2, join=True)
    two = [torch.load(tmp_path / f"eval-2-{r}.pt") for r in range(2)]
    assert two[0] == two[1], "every rank gets the same, reduced value"
    _eval_worker(0, 1, str(tmp_path))  # a 1-process gloo group in this process
    one = torch.load(tmp_path / "eval-1-0.pt")
    hand = {name: _by_hand(model, data) for name, (model, data) in _eval_cases(tmp_path).items()}
    assert set(two[0]) == set(one) and len(one) == 2 * len(hand)
    for name, value in one.items():
        case = name.removesuffix("/eval_mode_kept")
        # fp32 tolerance: the per-batch mean loss is fp32 and the batches pair different samples (0,1 vs 0,2).
        assert two[0][name] == pytest.approx(value, rel=1e-6), name
        assert value == pytest.approx(hand[case], rel=1e-6), name


# -- accumulation ≡ world size at a fixed global batch (real CLI, real gloo) -------------------------------
#
# Why these runs must reach the same parameters: DistributedSampler draws one permutation P of the dataset from
# seed + epoch alone (not from the rank or the world size), and rank r of W takes P[r::W]. With micro-batch B,
# optimizer step k of a run with W ranks and A accumulation micro-steps consumes, on rank r, micro-batches
# m = 0..A-1 made of P[r::W][(kA+m)B : (kA+m+1)B]; the union over r and m is exactly P[kWAB : (k+1)WAB], for
# every (W, A) with the same W·A. The gradient is the same mean over that set: DDP averages the ranks' gradients
# (÷W) and each micro-step's loss is divided by A before backward. Same init (one seed on every rank), same
# sample set per step, same mean gradient: only the fp32 summation order differs. (With a dataset length not
# divisible by W, DistributedSampler pads with repeats at the end of the epoch; the 64 samples of task=smoke and
# the few steps of task=gpt below never reach padding.)


def _final_params(root: Path, steps: int) -> dict[str, torch.Tensor]:
    [run] = run_dirs(root)
    return ckpt.load(str(run / "checkpoints" / f"step_{steps}"))["model"]


def _assert_same_params(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6, msg=lambda m, k=k: f"{k}: {m}")


def _train(root: Path, *args: str) -> None:
    r = ddp_run(["device=cpu", "checkpoint.async_save=false", *args], root)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.slow
def test_two_ranks_equal_one_rank_with_accumulation_gpt(tmp_path):
    # Tiny GPT with its recipe (AdamW, grad clip 1.0, warmup + cosine), 6 optimizer steps, global batch 16.
    common = ["task=gpt", "train.max_steps=6", "batch.per_rank=8", "seed=3", "data.val_fraction=0.001"]
    _train(tmp_path / "w2", *common, "world_size=2", "batch.accumulation=1")
    _train(tmp_path / "w1", *common, "world_size=1", "batch.accumulation=2")
    # Both kinds of micro-step in one run: no_sync with a foreach add into the gradients, then DDP's all-reduce
    # of the sum (micro-batch 4: step k still covers P[16k : 16k+16]).
    _train(tmp_path / "w2a2", *common, "world_size=2", "batch.accumulation=2", "batch.per_rank=4")
    a, b = _final_params(tmp_path / "w2", 6), _final_params(tmp_path / "w1", 6)
    _assert_same_params(a, b)
    _assert_same_params(a, _final_params(tmp_path / "w2a2", 6))
    # The logged loss is the mean over the same global batch either way.
    [w2], [w1] = run_dirs(tmp_path / "w2"), run_dirs(tmp_path / "w1")
    assert load_json(w2 / "summary.json")["losses"] == pytest.approx(load_json(w1 / "summary.json")["losses"],
                                                                     rel=1e-5)
    init = GPT(vocab=256, context=64, width=64, layers=2, heads=2).state_dict()
    assert any((a[k] - init[k]).abs().max() > 1e-3 for k in a), "the runs trained"


@pytest.mark.slow
def test_fixed_global_batch_world_one_vs_two_smoke_adamw(tmp_path):
    # batch.global=32 with batch.per_rank=8: accumulation 4 on one rank, 2 on two. 64 samples → 2 steps per
    # epoch; 3 epochs cross two epoch boundaries, so set_epoch's reshuffle is covered too.
    common = ["task=smoke", "batch.global=32", "batch.per_rank=8", "train.optimizer=adamw", "train.lr=0.05",
              "train.epochs=3"]
    _train(tmp_path / "w1", *common, "world_size=1")
    _train(tmp_path / "w2", *common, "world_size=2")
    for root, acc in ((tmp_path / "w1", 4), (tmp_path / "w2", 2)):
        [run] = run_dirs(root)
        assert ckpt.load(str(run / "checkpoints" / "step_6"))["plan"]["accumulation"] == acc
    _assert_same_params(_final_params(tmp_path / "w1", 6), _final_params(tmp_path / "w2", 6))


def test_inductor_settings_reach_torch_inductor_config():
    import torch._inductor.config as ic

    before = ic.get_config_copy()
    try:
        apply_inductor_settings({"combo_kernels": not before["combo_kernels"],
                                 "triton": {"cudagraphs": not before["triton.cudagraphs"]}})
        assert ic.combo_kernels is (not before["combo_kernels"])
        assert ic.triton.cudagraphs is (not before["triton.cudagraphs"])
    finally:
        ic.combo_kernels, ic.triton.cudagraphs = before["combo_kernels"], before["triton.cudagraphs"]


def test_each_rank_sees_only_its_own_gpu_as_cuda0() -> None:
    """Local rank k keeps the k-th visible device (torchrun's --virtual-local-rank mapping), now as cuda:0."""
    from tasks.engine.trainer import own_gpu

    assert own_gpu(None, 1) == "1"
    assert own_gpu("3,5", 0) == "3" and own_gpu("3, 5", 1) == "5"
    assert own_gpu("GPU-aaaa,GPU-bbbb", 1) == "GPU-bbbb"
    assert own_gpu("", 0) is None and own_gpu("3", 1) is None  # nothing to narrow to: CUDA's own error stands


def test_a_memory_cap_becomes_the_processes_share_of_its_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cap the planner checked the run against is the most its ranks may allocate on a GPU."""
    from runner.contract import layout
    from runner.contract.rules import asked_cap_gb
    from tasks.engine.config import Config
    from tasks.engine.trainer import memory_fraction

    monkeypatch.delenv(layout.ENV_MEMORY_CAP_GB, raising=False)
    assert asked_cap_gb(Config({"strategy": {"memory_cap_gb": None}}))[0] is None
    assert asked_cap_gb(Config({"strategy": {"memory_cap_gb": 40}}))[0] == 40.0
    monkeypatch.setenv(layout.ENV_MEMORY_CAP_GB, "24.5")
    assert asked_cap_gb(Config({"strategy": {"memory_cap_gb": None}}))[0] == 24.5
    assert asked_cap_gb(Config({"strategy": {"memory_cap_gb": 40}}))[0] == 40.0  # the config's key wins, as planned
    total = 140 * 2**30
    assert memory_fraction(None, total) is None
    assert memory_fraction(35, total) == pytest.approx(0.25)
    assert memory_fraction(140, total) is None and memory_fraction(500, total) is None
