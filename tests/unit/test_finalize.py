"""The driver's closing lines for a completed run (runner/console/closing.py, runner/diagnostics/breakdown.py):
one line for a short run, else one table of the ranks (GPU telemetry from summary.json's ``gpus`` in it), the
sentence about the rank with the most work, the note on a slow GPU, units on every figure."""

from __future__ import annotations

import pytest

from ddp_runner.console import closing
from ddp_runner.diagnostics import breakdown


def _gpu(clock: float, capped: float = 100.0, thermal: float = 0.0) -> dict[str, float]:
    return {"sm_clock_mhz": clock, "power_w": 691.4, "temperature_c": 54.5, "power_capped_pct": capped,
            "thermal_slowdown_pct": thermal}


def _w(data: float, compute: float, sync: float, opt: float) -> dict[str, float]:
    return {"data_ms": data, "compute_ms": compute, "exposed_sync_ms": sync, "optimizer_ms": opt,
            "step_ms": data + compute + sync + opt}


CHECK2 = {"completed_ranks": [0, 1], "devices": {"0": "cuda:0", "1": "cuda:1"}, "distinct_devices": True}


def test_no_telemetry_no_gpu_columns():
    assert breakdown.table(None, CHECK2["devices"], {}) == []
    assert closing.gpu_note({}) is None


def test_each_rank_in_rank_order_with_its_gpu_and_its_power_limit():
    head, row0, row1 = breakdown.table(None, CHECK2["devices"], {"1": _gpu(1740.0), "0": _gpu(1770.0, capped=0.0)})
    assert head.split() == ["rank", "device", "GPU", "clock", "power", "temp"]
    assert row0.split() == ["0", "cuda:0", "1770", "MHz", "691", "W", "54", "°C"]
    assert row1.endswith("54 °C  at its power limit") and row1.startswith("  1  ")


def test_a_gpu_clocked_well_below_the_others_is_named():
    # Call B's 2-GPU run (BENCHMARKS.md): 1785 against 1680 MHz, 5.9% apart.
    gpus = {"0": _gpu(1785.0), "1": _gpu(1680.0, thermal=12.0)}
    assert "thermal slowdown 12% of the time" in breakdown.table(None, CHECK2["devices"], gpus)[2]
    assert closing.gpu_note(gpus).startswith("note: rank 1's GPU ran 6% below rank 0's (1680 against 1785 MHz)")
    # Within 3% of each other (call A: 1770 and 1748 MHz): no note.
    assert closing.gpu_note({"0": _gpu(1770.0), "1": _gpu(1748.0)}) is None
    assert closing.gpu_note({"0": _gpu(1770.0)}) is None


def test_one_rank_reads_as_one_rank():
    one = {"completed_ranks": [0], "devices": {"0": "cpu:0"}, "distinct_devices": True}
    assert closing.where(one) == "1 rank on cpu:0"
    assert closing.where(CHECK2) == "2 ranks on distinct devices (cuda:0, cuda:1)"
    assert closing.where({**CHECK2, "distinct_devices": False}) == "2 ranks on SHARED devices (cuda:0, cuda:1)"


def _train(steps: int, wall: float) -> dict:
    return {"steps": steps, "final": {"train/loss": 0.72761}, "val_loss": 0.70123,
            "goodput": {"wall_s": wall, "seconds": {"startup": 8.0, "training": wall - 8.0},
                        "samples_per_s": 9.4, "tokens_per_s": 63606.2},
            "time_breakdown": {"per_rank": {"0": _w(0.2, 0.6, 0.1, 0.2), "1": _w(0.2, 0.5, 5.3, 0.2)},
                               "slowest_rank": 0, "fastest_rank": 1, "gap_pct": 100 * (1.0 - 0.9) / 0.9,
                               "shares": {"data": 0.2, "compute": 0.55, "exposed_sync": 0.09, "optimizer": 0.18},
                               "warmup_included": False},
            "gpus": {}}


def test_a_short_run_closes_with_one_line_and_points_at_the_summary():
    [line] = closing.completed_lines(_train(4, 9.0), CHECK2, "/runs/x/summary.json")
    assert line == ("ddp-run: completed: 4 steps, 2 ranks on distinct devices (cuda:0, cuda:1), final loss 0.7276,"
                    " val loss 0.7012, 9.0 s wall-clock (8.0 s start-up), goodput 63,606 tokens/s;"
                    " details: /runs/x/summary.json")
    # By steps only: 400 steps get the whole account even in 9 s (a config closes the same way under any load).
    assert len(closing.completed_lines(_train(400, 9.0), CHECK2, "s")) > 1
    assert len(closing.completed_lines(_train(19, 600.0), CHECK2, "s")) == 1


def test_a_long_run_has_one_table_whose_marked_rank_is_the_one_the_sentence_names():
    # The issue's run: rank 1's step is the longest (6.2 ms: it waits for rank 0 in the sync), rank 0 has the
    # most work (1.0 against 0.9 ms). Both figures are in one table, and the sentence names the marked rank.
    lines = closing.completed_lines(_train(100, 60.0), CHECK2, "s")
    assert lines[0] == ("ddp-run: completed: 100 steps, 2 ranks on distinct devices (cuda:0, cuda:1),"
                        " final loss 0.7276, val loss 0.7012")
    assert lines[1].startswith("ddp-run: each rank, mean per optimizer step (work: the step less its wait in the")
    rows = {line.split()[0]: line for line in lines[3:5]}
    assert rows["0"].split()[-4:] == ["1.0", "ms", "most", "work"] and rows["1"].split()[-2:] == ["0.9", "ms"]
    assert " 6.2 ms " in rows["1"]
    assert lines[5].startswith("ddp-run: rank 0 has the most work per step (1.00 ms against 0.90 ms on rank 1,"
                               " +11.1%)")
    assert lines[6].startswith("ddp-run: wall-clock 60.0 s: start-up 8.0 s")
    assert lines[6].endswith("goodput 63,606 tokens/s")


# -- issue 43, item 4: the closing account fits the terminal; a sweep's job closes with one line --------------------

def _long_run() -> dict:
    """A long run on two GPUs with telemetry: the widest closing account (table with GPU columns and notes)."""
    train = _train(100, 60.0)
    train["gpus"] = {"0": _gpu(1785.0), "1": _gpu(1680.0, thermal=12.0)}
    train["goodput"]["startup_parts"] = {"driver": 0.4, "agent": 4.2, "imports": 1.3, "process_group": 0.5,
                                         "build": 6.1, "loop_setup": 0.0}
    train["goodput"]["time_to_first_checkpoint_s"] = 50.9
    return train


@pytest.mark.parametrize("width", [60, 80, 100, 120])
def test_the_closing_account_fits_the_terminal(width):
    """Lines of 96-206 characters at every width before: on a terminal, every line fits it; sentences wrap (their
    words all kept), the ranks' table drops its least telling columns (summary.json keeps every figure)."""
    wide = closing.completed_lines(_long_run(), CHECK2, "summary.json")
    assert max(map(len, wide)) > 120  # what a pipe still gets: one record per line
    lines = closing.completed_lines(_long_run(), CHECK2, "summary.json", width=width)
    assert all(len(line) <= width for line in lines), [line for line in lines if len(line) > width]
    words = " ".join(line.strip() for line in lines).split()
    for sentence in (wide[0], wide[5], wide[6], wide[-1]):  # head, the most-work sentence, GPU note, start-up
        assert " ".join(sentence.split()) in " ".join(words), sentence
    rows = [line for line in lines if line.startswith("  ") and line.split()[0] in ("0", "1")]
    assert [r.split()[1] for r in rows] == ["cuda:0", "cuda:1"] and "most work" in rows[0]
    short = closing.completed_lines(_train(4, 9.0), CHECK2, "summary.json", width=width)
    assert all(len(line) <= width for line in short) and "details: summary.json" in " ".join(short)


def test_a_sweeps_job_closes_with_one_line():
    """Repeated for every job of a sequential sweep before (the whole account each time): one line per finished
    job, its detail in its summary.json, the sweep's table at the end (runner/report/sweep_table.py)."""
    assert closing.job_line(_long_run(), 3) == [
        "ddp-run: job 3 completed: 100 steps, final loss 0.7276, val loss 0.7012, 60.0 s wall-clock"]
    assert closing.job_line(_long_run(), 3, width=60) == [
        "ddp-run: job 3 completed: 100 steps, final loss 0.7276, val", "  loss 0.7012, 60.0 s wall-clock"]


def test_the_driver_closes_a_sweeps_job_with_its_one_line(tmp_path, capsys, monkeypatch):
    """finalize.finish on a completed run whose manifest names its sweep: one line, and no table."""
    monkeypatch.delenv("DDP_RUNNER_SWEEP_CONSOLE", raising=False)  # a sweep run in turn (not a concurrent one's job)
    from types import SimpleNamespace

    from ddp_runner.supervise import finalize

    rd = SimpleNamespace(url=str(tmp_path), local=str(tmp_path))
    manifest = {"invocation": {"sweep": {"id": "s", "dir": "d", "job": 2}}}
    assert finalize._closing(rd, manifest, _long_run(), CHECK2) == [  # run in turn: it names its run directory
        f"ddp-run: job 2 completed: 100 steps, final loss 0.7276, val loss 0.7012, 60.0 s wall-clock; {tmp_path}"]
    manifest["invocation"]["sweep"] = None
    assert len(finalize._closing(rd, manifest, _long_run(), CHECK2)) > 5  # a run of its own: the whole account
