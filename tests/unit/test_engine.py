"""The training engine's arithmetic on CPU: LR schedule, resumable sampler, exact distributed validation in a
real 2-process gloo group, and (through the CLI) accumulation/world-size equivalence at a fixed global batch.
"""

from __future__ import annotations

import math
import os

import pytest
import torch

from ddp_runner.tasks.engine.optim import apply_inductor_settings, lr_factor
from ddp_runner.tasks.engine.sampler import ResumableDistributedSampler

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
    from ddp_runner.tasks.engine.rank import own_gpu

    assert own_gpu(None, 1) == "1"
    assert own_gpu("3,5", 0) == "3" and own_gpu("3, 5", 1) == "5"
    assert own_gpu("GPU-aaaa,GPU-bbbb", 1) == "GPU-bbbb"
    assert own_gpu("", 0) is None and own_gpu("3", 1) is None  # nothing to narrow to: CUDA's own error stands


def test_a_memory_cap_becomes_the_processes_share_of_its_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cap the planner checked the run against is the most its ranks may allocate on a GPU."""
    from ddp_runner.contract import layout
    from ddp_runner.contract.rules import asked_cap_gb
    from ddp_runner.tasks.engine.config import Config
    from ddp_runner.tasks.engine.rank import memory_fraction

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


def test_deterministic_kernels_turn_on_torchs_deterministic_algorithms(monkeypatch):
    # train.deterministic: an op without a deterministic kernel then raises (on CUDA: index_add_, scatter_add_…)
    # instead of adding in whatever order its threads finish; cuBLAS gets its fixed workspace before CUDA starts.
    import torch._inductor.config as inductor_config

    from ddp_runner.tasks.engine.rank import deterministic_kernels

    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    before = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic,
              torch.backends.cudnn.benchmark, inductor_config.deterministic)
    try:
        deterministic_kernels()
        assert torch.are_deterministic_algorithms_enabled()
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
        assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
        assert inductor_config.deterministic
    finally:
        torch.use_deterministic_algorithms(before[0])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = before[1], before[2]
        inductor_config.deterministic = before[3]
