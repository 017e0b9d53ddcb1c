"""The training engine's arithmetic on CPU: LR schedule, resumable sampler, exact distributed validation in a
real 2-process gloo group, and (through the CLI) accumulation/world-size equivalence at a fixed global batch.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import ddp_run, load_json, run_dirs

from ddp_runner.tasks.engine import checkpoint as ckpt
from ddp_runner.tasks.gpt.model import GPT

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


# The smoke task at a fixed global batch, world size 1 × accumulation 4 against 2 × 2 across two epoch
# boundaries: tests/e2e/test_guards_e2e.py::test_sgd_one_rank_times_four_equals_two_ranks_times_two_and_by_hand.
