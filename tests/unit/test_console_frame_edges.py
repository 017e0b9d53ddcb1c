"""The console's edges that a mutation audit found untested (issue 51, "Tests the product lacks"), and the bar during a
validation: the text fitter drops no more table columns than the notes need (runner/console/textfit.columns); the
live bar's width is capped at ``BAR_MAX``, keeps ``BAR_MIN`` down to the exact width, and drops the task's last
extra metric before its first (runner/console/live_frame.py); a second, different stop signal before the launch is
recorded does not replace the first (runner/supervise/stop/guard.take); ``validating…`` in the bar while rank 0
validates."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path
from typing import Any

from ddp_runner.console import live, live_frame, textfit
from ddp_runner.supervise.stop import guard
from ddp_runner.tasks.engine.reporting import progress

# -- textfit.columns -------------------------------------------------------------------------------------------------

NOTE = "most work, at its power limit and clocked low"
ROWS = [("rank", "device", "work", "wait"), ("0", "cuda:0 (NVIDIA H200)", "12.3 ms", "0.1 ms", NOTE),
        ("1", "cuda:1 (NVIDIA H200)", "11.0 ms", "1.4 ms")]
# Where the notes begin: all four columns, then without the device. NOTE_ROOM columns from there are the notes'.
NOTES_AT_ALL, NOTES_AT_NO_DEVICE = 47, 25


def _head(width: int) -> list[str]:
    return textfit.columns(ROWS, width, ("device", "wait"))[0].split()


def test_columns_go_only_until_the_notes_have_their_room() -> None:
    assert _head(NOTES_AT_ALL + textfit.NOTE_ROOM) == ["rank", "device", "work", "wait"]  # the exact width: none
    assert _head(NOTES_AT_ALL + textfit.NOTE_ROOM - 1) == ["rank", "work", "wait"]
    # The widest line (the note) is still wider than 60 once the device is gone, but the note has its room: it
    # wraps under itself, and the wait column stays.
    for width in (NOTES_AT_NO_DEVICE + textfit.NOTE_ROOM, 60):
        lines = textfit.columns(ROWS, width, ("device", "wait"))
        assert lines[0].split() == ["rank", "work", "wait"], lines
        assert all(len(line) <= width for line in lines), lines
        assert lines[2].startswith(" " * NOTES_AT_NO_DEVICE) and not lines[2].startswith(" " * (NOTES_AT_NO_DEVICE + 1))
    assert _head(NOTES_AT_NO_DEVICE + textfit.NOTE_ROOM - 1) == ["rank", "work"]


# -- the live bar's frame ------------------------------------------------------------------------------------------

STATE = {"step": 16, "total": 48, "loss": 0.1376, "rate": 12895.2, "unit": "samples/s", "val": 0.1153,
         "metrics": {"val/accuracy": 0.99609, "val/f1": 0.9812}}


def _fields() -> list[live_frame.Field]:
    return live_frame.fields(STATE, "mytask · 2 ranks", 12.0, 3.0, finished=False)


def test_the_bar_is_capped_at_its_maximum_on_a_wide_terminal() -> None:
    fields = _fields()
    for width in (200, live_frame.text_width(fields) + live_frame.BAR_MAX + 1):
        kept, bar = live_frame.layout(fields, width)
        assert bar == live_frame.BAR_MAX and kept == fields, (width, bar)


def test_the_bar_keeps_its_minimum_down_to_the_exact_width_where_it_fits() -> None:
    fields = _fields()
    exact = live_frame.text_width(fields) + live_frame.BAR_MIN
    kept, bar = live_frame.layout(fields, exact)
    assert kept == fields and bar == live_frame.BAR_MIN
    kept, bar = live_frame.layout(fields, exact - 1)  # one column less: the ETA goes, the bar keeps its minimum
    assert [f.key for f in fields if f not in kept] == ["eta"] and bar >= live_frame.BAR_MIN


def test_the_last_extra_metric_goes_before_the_first() -> None:
    fields = _fields()
    seen = set()
    for width in range(live_frame.text_width(fields) + live_frame.BAR_MIN, 20, -1):
        kept, _ = live_frame.layout(fields, width)
        seen.add(tuple(f.text for f in kept if f.key == "metric"))
    assert seen == {("val accuracy 0.9961", "val f1 0.9812"), ("val accuracy 0.9961",), ()}, seen


# -- a stop before the launch is recorded ----------------------------------------------------------------------------

def test_the_first_of_two_different_signals_is_the_one_taken() -> None:
    old = guard.install()
    try:
        with guard.deferred():
            os.kill(os.getpid(), signal.SIGHUP)
            os.kill(os.getpid(), signal.SIGTERM)
            assert guard.take() == signal.SIGHUP
            assert guard.take() is None  # taken once
    finally:
        guard.restore(old)


# -- validating… in the bar ----------------------------------------------------------------------------------------

def test_the_bar_says_validating_while_rank_0_validates(tmp_path: Path) -> None:
    path = tmp_path / "console.jsonl"
    bar = live.Live(str(path), "mytask · 2 ranks")  # before rank 0 writes: it reads from the file's end on
    console = progress.RecordConsole(str(path))
    p = progress.Progress(console, total=48)
    p.update(16, 0.1376, 12895.2)
    p.phase("validation")
    bar.tick()
    frame = live_frame.fields(bar.state, bar.label, 12.0, None, finished=False)
    assert [f.text for f in frame if f.key == "phase"] == ["validating…"], frame
    kept, _ = live_frame.layout(frame, 60)  # a narrow terminal: the step, the phase and the loss stay
    assert {"steps", "phase", "loss"} <= {f.key for f in kept}, kept
    p.validated(16, 0.1153)
    p.phase(None)
    bar.tick()
    assert not [f for f in live_frame.fields(bar.state, bar.label, 13.0, None, False) if f.key == "phase"]
    console.close()


def test_the_validator_says_when_it_begins_and_ends(monkeypatch: Any) -> None:
    from ddp_runner.tasks.engine import validation

    said: list[str | None] = []

    class Seen:
        def phase(self, name: str | None) -> None:
            said.append(name)

    v = object.__new__(validation.Validator)
    monkeypatch.setattr(v, "phase", lambda name: contextlib.nullcontext(), raising=False)
    monkeypatch.setattr(v, "_run", lambda *args: said.append("ran") or 0.5, raising=False)
    assert v.run(None, 16, Seen()) == 0.5  # type: ignore[arg-type]
    assert said == ["validation", "ran", None]


def test_a_concurrent_sweeps_row_knows_its_job_validates(tmp_path: Path) -> None:
    from ddp_runner.console import sweep_view

    path = tmp_path / "console.jsonl"
    console = progress.RecordConsole(str(path))
    p = progress.Progress(console, total=48)
    p.update(16, 0.1376, 12895.2)
    p.phase("validation")
    records = sweep_view.Records(str(path))
    assert records.read()["phase"] == "validation"
    p.validated(16, 0.1153)
    p.phase(None)
    assert records.read()["phase"] is None
    console.close()
