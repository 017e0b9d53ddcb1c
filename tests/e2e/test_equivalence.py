"""The training engine's arithmetic on CPU: LR schedule, resumable sampler, exact distributed validation in a
real 2-process gloo group, and (through the CLI) accumulation/world-size equivalence at a fixed global batch.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ddp_runner.tasks.engine import checkpoint as ckpt
from tests.support.run_tree import load_json, run_dirs

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


def _final_params(run: Path, steps: int) -> dict[str, torch.Tensor]:
    return ckpt.load(str(run / "checkpoints" / f"step_{steps}"))["model"]


def _assert_same_params(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    """The same parameters up to the fp32 summation order, whose effect AdamW amplifies where a gradient is near
    zero (it divides by the root of the squared gradients' average): every element within 1e-5 (1% of one step's
    largest update at lr 1e-3), and the mean difference under 1e-8 (the last two steps moved the weights by ~2e-4
    on average). A wrong sample set or scaling moves most elements by about one update."""
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=1e-5, msg=lambda m, k=k: f"{k}: {m}")
    diff = torch.cat([(a[k] - b[k]).abs().flatten() for k in a])
    assert diff.mean() < 1e-8, f"mean difference {diff.mean():.2e} over {diff.numel()} parameters"


def test_one_to_four_ranks_with_accumulation_reach_the_same_gpt(gpt_world_sweep: Path) -> None:
    # The session's tiny-GPT sweep (tests/e2e/conftest.py) with its recipe (AdamW, grad clip 1.0, warmup + cosine):
    # 12 optimizer steps at a global batch of 24 from micro-batches of 2, as 1 rank × 12 micro-steps, 2 × 6, 3 × 4
    # and 4 × 3. With ranks and micro-steps both, a step has both kinds of micro-step: no_sync with a foreach add
    # into the gradients, then DDP's all-reduce of the sum.
    runs = {load_json(r / "run.json")["plan"]["world_size"]: r for r in run_dirs(gpt_world_sweep)}
    assert sorted(runs) == [1, 2, 3, 4]
    params = {w: _final_params(run, 12) for w, run in runs.items()}
    for w in (2, 3, 4):
        _assert_same_params(params[1], params[w])
        # The logged loss is the mean over the same global batch either way.
        assert load_json(runs[w] / "summary.json")["losses"] == pytest.approx(
            load_json(runs[1] / "summary.json")["losses"], rel=1e-5)
    # The runs trained (the comparison is meaningful): the loss fell, and the last steps, at the cosine schedule's
    # tail, still moved the weights.
    losses = load_json(runs[1] / "summary.json")["losses"]
    assert losses[-1] < losses[0] - 0.1, losses
    before = _final_params(runs[1], 10)
    assert not all(torch.equal(params[1][k], before[k]) for k in before), "steps 11-12 moved the weights"


# The smoke task at a fixed global batch, world size 1 × accumulation 4 against 2 × 2 across two epoch
# boundaries: tests/e2e/test_guards_e2e.py::test_sgd_one_rank_times_four_equals_two_ranks_times_two_and_by_hand.
