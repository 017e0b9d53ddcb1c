"""The training engine's arithmetic on CPU: LR schedule, resumable sampler, exact distributed validation in a
real 2-process gloo group, and (through the CLI) accumulation/world-size equivalence at a fixed global batch.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch.utils.data import Dataset

from ddp_runner.tasks.engine.rank import Context
from ddp_runner.tasks.engine.validation import evaluate
from ddp_runner.tasks.gpt.data import TokenWindows
from ddp_runner.tasks.gpt.model import GPT
from ddp_runner.tasks.smoke import Regression, synthetic_dataset
from tests.support.spawn import spawn

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
    spawn(_eval_worker, args=(2, str(tmp_path)))
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
