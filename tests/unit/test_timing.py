"""Where each step's time goes (tasks/engine/timing.py): phase arithmetic, the CPU timer, the slowest/fastest rank,
the words the console and ddp-compare make of it, and DDP's last-bucket notice on real gloo."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from ddp_runner.diagnostics import breakdown
from ddp_runner.report import compare
from ddp_runner.tasks.engine import timing


def test_each_interval_counts_for_the_phase_its_end_names_and_they_add_up_to_the_step():
    marks = [("data", 1.0), ("compute", 11.0), ("data", 12.0), ("compute", 20.0), ("exposed_sync", 23.0),
             ("optimizer", 25.0)]
    out = timing.phase_times(0.0, marks, lambda a, b: b - a)
    assert out == {"data_ms": 2.0, "compute_ms": 18.0, "exposed_sync_ms": 3.0, "optimizer_ms": 2.0, "step_ms": 25.0}


def _step(timer: timing.PhaseTimer, step: int, sync: bool, data_s: float = 0.0, sync_s: float = 0.0) -> None:
    timer.begin_step(step)
    for last in (False, True):
        time.sleep(data_s)
        timer.mark("data")
        if last and sync:
            timer.grads_ready()
            time.sleep(sync_s)
        timer.end_micro_step()
    timer.end_step()


def test_cpu_timer_samples_every_nth_step_but_never_the_first_and_sees_the_waits():
    timer = timing.PhaseTimer(torch.device("cpu"), every=2, first_step=1)
    for s in range(1, 7):
        _step(timer, s, sync=True, data_s=0.002, sync_s=0.01)
    w = timer.window()
    assert w is not None and w["exposed_sync_ms"] >= 10 and w["data_ms"] >= 4
    assert w["step_ms"] == pytest.approx(sum(w[f"{p}_ms"] for p in timing.PHASES))
    assert timer.window() is None  # a new window: nothing read since
    # Only steps 2, 4, 6 were sampled (step 1 is compilation): 3 samples' mean, not 6.
    counted = timing.PhaseTimer(torch.device("cpu"), every=2, first_step=1)
    for s in range(1, 7):
        _step(counted, s, sync=False)
    counted._read_ready()
    assert len(counted._window) == 3


def test_without_a_sync_the_backward_is_compute_and_off_means_nothing_is_recorded():
    timer = timing.PhaseTimer(torch.device("cpu"), every=1, first_step=0)
    _step(timer, 1, sync=False)
    assert timer.window()["exposed_sync_ms"] == 0.0
    off = timing.PhaseTimer(torch.device("cpu"), every=0, first_step=0)
    _step(off, 1, sync=True)
    assert off.window() is None


def _w(data, compute, sync, opt):
    return {"data_ms": data, "compute_ms": compute, "exposed_sync_ms": sync, "optimizer_ms": opt,
            "step_ms": data + compute + sync + opt}


def test_summary_names_the_rank_with_most_work_and_drops_the_warm_up_window():
    windows = {0: [_w(0, 500, 0, 0), _w(1, 90, 10, 4), _w(1, 90, 10, 4)],  # rank 0 waits for rank 1
               1: [_w(0, 500, 0, 0), _w(1, 99, 1, 4), _w(1, 99, 1, 4)]}
    tb = timing.summarize(windows, every=1)
    assert tb["per_rank"]["0"] == _w(1, 90, 10, 4) and tb["per_rank"]["1"] == _w(1, 99, 1, 4)
    assert (tb["slowest_rank"], tb["fastest_rank"]) == (1, 0)
    assert tb["gap_pct"] == pytest.approx(100 * (104 - 95) / 95)
    assert tb["shares"]["exposed_sync"] == pytest.approx(1 / 105) and tb["shares"]["compute"] == pytest.approx(99 / 105)
    assert timing.summarize({}, 1) is None
    uneven = timing.summarize({0: [_w(0, 500, 0, 0), _w(1, 90, 10, 4), _w(3, 70, 30, 2)]}, 1)["per_rank"]["0"]
    assert uneven["step_ms"] == pytest.approx(sum(uneven[f"{p}_ms"] for p in timing.PHASES))  # still adds up
    assert timing.summarize({0: [_w(1, 2, 0, 1)]}, 1)["per_rank"]["0"]["step_ms"] == 4  # one window: kept
    scalars = timing.scalars({0: _w(1, 90, 10, 4), 1: _w(1, 99, 1, 4)})
    assert scalars["time/rank1/compute_ms"] == 99 and scalars["time/gap_pct"] == pytest.approx(100 * 9 / 95)


def test_console_lines_and_bottleneck_sentence_from_the_breakdown():
    warm = _w(0, 500, 0, 0)  # the first logging window (warm-up): left out
    tb = timing.summarize({0: [warm, _w(0.5, 90, 10, 4)], 1: [warm, _w(0.5, 96, 4, 4)]}, every=1)
    assert not tb["warmup_included"]
    # One table: rank 0 has the longest step (it waits 10 ms for rank 1 in the sync), rank 1 the most work; the
    # table marks the rank the sentence names.
    head, row0, row1 = breakdown.table(tb, {"0": "cuda:0", "1": "cuda:1"})
    assert head.split() == ["rank", "device", "data", "compute", "exposed", "sync", "optimizer", "step", "work"]
    assert row0.split() == ["0", "cuda:0", "0.5", "ms", "90.0", "ms", "10.0", "ms", "4.0", "ms", "104.5", "ms",
                            "94.5", "ms"]
    assert row1.split()[-4:] == ["100.5", "ms", "most", "work"]
    assert breakdown.slowest_line(tb).startswith(
        "rank 1 has the most work per step (100.50 ms against 94.50 ms on rank 0, +6.3%)")
    run = compare.Run(path=Path("x"), name="x", status="completed", world=2, device="cuda", global_batch=64,
                      task="gpt", step_time_s=0.1, data_wait_s=0.0, time_breakdown=tb)
    text = compare.bottleneck(run, 0.95)
    assert text == ("x (2 GPUs): 95% scaling efficiency; data loading is hidden (under 1% of a step);"
                    " 4% of each step waits for gradient sync; rank 1 is 6% slower than rank 0.")
    row = compare.rows([run], None, 1.0)[0]
    assert row["exposed_sync_share"] == pytest.approx(4 / 104.5)
    assert row["rank_gap_pct"] == pytest.approx(100 * 6 / 94.5)
    assert breakdown.table(None) == [] and breakdown.slowest_line(None) is None and breakdown.phrases(None) == []
    # One window only: the figures include the warm-up, and every reader is told.
    short = timing.summarize({0: [_w(0.5, 90, 10, 4)], 1: [_w(0.5, 96, 4, 4)]}, every=1)
    assert short["warmup_included"]
    assert "warm-up included" in breakdown.slowest_line(short) and "warm-up included" in breakdown.phrases(short)[-1]
