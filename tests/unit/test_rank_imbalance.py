"""The rank-imbalance sentence (the closing account's and ddp-compare's) speaks only of a real imbalance: the rank
with the most work a few per cent over the ranks' median and over a floor of timer jitter. Below that, the ranks
are even, and the sentence says so instead of sending the reader after a rank that is 0.1% slower."""

from __future__ import annotations

import pytest

from ddp_runner.diagnostics import breakdown
from ddp_runner.tasks.engine import timing


def _w(compute: float) -> dict[str, float]:
    return {"data_ms": 0.0, "compute_ms": compute, "exposed_sync_ms": 0.0, "optimizer_ms": 0.0, "step_ms": compute}


def _tb(*work: float) -> dict:
    """The time breakdown of ranks with these works per step (a warm-up window first, left out)."""
    return timing.summarize({r: [_w(500.0), _w(w)] for r, w in enumerate(work)}, every=1)


WAITS = "the other ranks wait for it in the gradient sync"


@pytest.mark.parametrize("work", [(10.01, 10.0), (10.0, 10.0, 10.0, 10.29), (0.0105, 0.01), (10.0, 10.0)],
                         ids=["+0.1%", "2.9% over the median", "5% but under the floor", "equal"])
def test_an_even_run_names_no_imbalance(work: tuple[float, ...]) -> None:
    tb = _tb(*work)
    line = breakdown.slowest_line(tb)
    assert WAITS not in line and line.startswith("the ranks' work per step is even (rank "), line
    assert not any("slower than rank" in p for p in breakdown.phrases(tb)), breakdown.phrases(tb)
    assert not breakdown.imbalanced(tb)


@pytest.mark.parametrize("work", [(10.7, 10.0), (10.0, 10.0, 10.0, 10.31), (0.2, 0.1)],
                         ids=["2 ranks, 3.4% over the median", "3.1% over the median", "double, over the floor"])
def test_an_uneven_run_names_the_rank_with_the_most_work(work: tuple[float, ...]) -> None:
    tb = _tb(*work)
    slow = str(tb["slowest_rank"])
    assert breakdown.imbalanced(tb)
    line = breakdown.slowest_line(tb)
    assert line.startswith(f"rank {slow} has the most work per step (") and WAITS in line, line
    assert any(p.startswith(f"rank {slow} is ") and "slower than rank" in p for p in breakdown.phrases(tb))


def test_the_threshold_is_the_documented_one() -> None:
    assert breakdown.IMBALANCE_PCT == 3.0 and breakdown.IMBALANCE_FLOOR_MS == 0.02
