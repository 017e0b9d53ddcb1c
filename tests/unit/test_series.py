"""summary.json's series stay bounded however long the run (issue 33; runner/contract/series.py), and every reader
of them still works: ddp-compare's loss points, the runs listing's last loss."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

from ddp_runner.contract import series
from ddp_runner.report import compare
from ddp_runner.rundir import figures
from ddp_runner.tasks.engine.reporting.summary import series_of, window_ends


def test_a_long_series_keeps_its_first_last_extremes_and_spikes_within_the_bound():
    n = 100_000
    values = [10.0 / (1 + i) for i in range(n)]
    values[31_337] = 50.0          # a spike
    values[77_777] = float("nan")  # a diverged value
    keep = series.kept_indices(values, 64)
    assert len(keep) <= 64 and keep == sorted(set(keep))
    assert {0, n - 1, 31_337, 77_777} <= set(keep)
    kept = [values[i] for i in keep]
    assert min(v for v in kept if not math.isnan(v)) == values[-1], "the best (last, here) value is kept"
    assert series.kept_indices(values[:10], 64) == list(range(10)), "a short series is left whole"


def test_the_engine_summary_series_are_bounded_and_carry_their_steps():
    n, every = 200_000, 1
    losses = [5.0 - i * 1e-5 for i in range(n)]
    history = {"step_time_s": [0.1] * (n - 1), "tokens_per_s": [1e5] * (n - 1), "mfu_pct": [40.0] * (n - 1)}
    history["step_time_s"][12_345] = 0.9  # one slow window
    state = SimpleNamespace(step=n, losses=losses)
    loop = SimpleNamespace(start_step=0, meter=SimpleNamespace(history=history, span_unix=[0.0, 1.0]))
    out = series_of(loop, state, every)  # type: ignore[arg-type]
    size = len(json.dumps(out))
    assert size < 40_000, f"{size} bytes for {n} logged steps"  # unbounded: ~77 bytes per logged step
    assert len(out["losses"]) == len(out["loss_steps"]) <= series.MAX_POINTS
    assert out["losses"][-1] == losses[-1] and out["loss_steps"][-1] == n and out["losses_logged"] == n
    w = out["perf_windows"]
    assert w["count"] == n - 1 and len(w["step_time_s"]) == len(w["steps"]) <= series.MAX_POINTS
    assert 0.9 in w["step_time_s"] and w["steps"][w["step_time_s"].index(0.9)] == 12_345 + 2  # window 2 ends at 2


def test_window_ends_follow_the_log_steps_from_where_the_launch_began():
    assert window_ends(0, 12, 5) == [5, 10, 12]
    assert window_ends(7, 20, 5) == [10, 15, 20]  # a resume from step 7


def test_compare_reads_the_named_steps_and_older_summaries_without_them(tmp_path: Path):
    new = figures.losses({"losses": [3.0, float("nan"), 1.0], "loss_steps": [1, 500, 1000]})
    assert new == ([3.0, 1.0], [1, 1000])
    assert compare.loss_at_steps(new[0], 5, 1000, new[1]) == [(1, 3.0), (1000, 1.0)]
    old = figures.losses({"losses": [3.0, 2.0]})
    assert old == ([3.0, 2.0], None)
    assert compare.loss_at_steps(old[0], 5, 10, old[1]) == [(5, 3.0), (10, 2.0)]
