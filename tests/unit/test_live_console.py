"""The live terminal's pieces: rank 0's console (tasks/engine/reporting/progress.py) as plain lines or as records, and
the driver's bar drawn from those records (runner/console/live.py) into a terminal-like rich console."""

from __future__ import annotations

import io
import json
import select

import pytest

from ddp_runner.console import live
from ddp_runner.tasks.engine.reporting import progress
from tests.support import live_screen


class _Pipe(io.StringIO):
    def isatty(self) -> bool:
        return False


def test_plain_lines_carry_the_unit_and_the_validation_loss():
    out = _Pipe()
    p = progress.Progress(out, total=20, unit="tokens/s")
    for step in range(1, 21):
        p.update(step, loss=1.0 / step, rate=63606.4)
    p.validated(20, 0.70123)
    p.close()
    lines = out.getvalue().splitlines()
    assert lines[0] == "  step 2/20  loss 0.5000  63,606 tokens/s"  # every total // 10 steps
    assert len(lines) == 11 and lines[-2].startswith("  step 20/20  loss 0.0500  63,606 tokens/s")
    assert lines[-1] == "  step 20/20  val loss 0.7012"
    assert progress.rate_text(9.4, "samples/s") == "9 samples/s"


def _records(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_records_for_the_driver(tmp_path, monkeypatch):
    path = tmp_path / "console.jsonl"
    monkeypatch.setenv("DDP_RUNNER_CONSOLE_RECORDS", str(path))
    console = progress.open_console(str(tmp_path))
    assert isinstance(console, progress.RecordConsole) and not console.isatty()
    progress.stage(console, "building the model and data")
    p = progress.Progress(console, total=8, start=2, unit="samples/s")
    p.update(3, 0.5, 100.0)
    p.update(4, 0.4, 110.0)   # within RECORD_EVERY_S of step 3: held back…
    p.validated(4, 0.45)      # …and recorded before the validation loss it belongs to
    print("warning: a checkpoint was passed over", file=console, flush=True)  # what other code prints
    console.write("partial ")
    p.update(8, 0.3, 120.0)   # the last step always
    p.close()
    console.close()
    recs = _records(path)
    assert [r["kind"] for r in recs] == ["stage", "start", "step", "step", "val", "line", "step", "line"]
    assert recs[1] == {**recs[1], "total": 8, "start": 2, "unit": "samples/s"}
    assert [r.get("step") for r in recs if r["kind"] == "step"] == [3, 4, 8]
    assert recs[5]["text"] == "warning: a checkpoint was passed over" and recs[7]["text"] == "partial "
    progress.stage(_Pipe(), "nothing")  # a plain console gets no stage lines


def _bar(tmp_path):
    from rich.console import Console

    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=140, color_system=None)
    path = tmp_path / "console.jsonl"
    path.write_text(json.dumps({"kind": "line", "text": "an earlier launch's record"}) + "\n")
    return live.Live(str(path), "gpt · 2 ranks", console=console), path, out


def test_the_bar_shows_steps_loss_rate_with_unit_eta_and_prints_lines_above(tmp_path):
    bar, path, out = _bar(tmp_path)
    bar.start()
    bar.refresh()
    assert "start-up: starting the workers" in out.getvalue() and "elapsed 0:0" in out.getvalue()
    with open(path, "a") as f:
        for rec in ({"kind": "stage", "text": "first step"}, {"kind": "start", "total": 8, "start": 0,
                                                               "unit": "tokens/s"},
                    {"kind": "step", "step": 3, "total": 8, "loss": 0.5, "rate": 63606.4}):
            f.write(json.dumps(rec) + "\n")
        f.write('{"kind": "val", "step": 4, "loss": 0.45')  # half a record: waits for its end
    bar.tick()
    bar.refresh()
    text = out.getvalue()
    assert "gpt · 2 ranks" in text and "step 3/8" in text and "loss 0.5000 · 63,606 tokens/s" in text
    assert "an earlier launch's record" not in text  # a continued run's file is read from where it ended
    with open(path, "a") as f:
        f.write("}\n" + json.dumps({"kind": "line", "text": "warning: [red]not markup[/red]"}) + "\n")
    bar.tick()
    bar.stop()
    text = out.getvalue()
    assert "  step 4/8  val loss 0.4500" in text and "warning: [red]not markup[/red]" in text
    assert "loss 0.5000 · 63,606 tokens/s · val loss 0.4500" in text  # the bar's figures keep it


def test_figures_and_times():
    assert live.figures({"loss": 0.72761, "rate": 9.4, "unit": "samples/s"}) == "loss 0.7276 · 9 samples/s"
    assert live.figures({"loss": 1.0, "rate": 63606.0, "unit": "tokens/s", "val": 0.5}) == \
        "loss 1.0000 · 63,606 tokens/s · val loss 0.5000"
    assert live.times_text(14.2, None, False) == "elapsed 0:14"
    assert live.times_text(75, 3723, False) == "elapsed 1:15 · ETA 1:02:03"
    assert live.times_text(75, 0, True) == "elapsed 1:15"
    assert live.steps_text(3, 8) == "step 3/8" and live.steps_text(0, None) == ""


def test_a_bar_only_on_a_terminal_that_can_redraw(monkeypatch):
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setenv("TERM", "xterm")
    assert live.wanted(Tty()) and not live.wanted(_Pipe())
    monkeypatch.setenv("TERM", "dumb")
    assert not live.wanted(Tty())


def test_the_judging_session_asks_rank_0_for_records_only_under_a_terminal_on_one_host(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from ddp_runner.contract import layout
    from ddp_runner.supervise import session

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    rd, conf = SimpleNamespace(local=str(tmp_path)), {"task": {"name": "smoke"}}
    one_host, two_hosts = SimpleNamespace(world_size=2, nnodes=1), SimpleNamespace(world_size=4, nnodes=2)
    monkeypatch.setenv("TERM", "xterm")
    env = {layout.ENV_CONSOLE_RECORDS: "/inherited/from/the/user"}
    monkeypatch.setattr("sys.stdout", _Pipe())
    assert session.live_bar(rd, conf, one_host, env) is None and layout.ENV_CONSOLE_RECORDS not in env
    monkeypatch.setattr("sys.stdout", Tty())
    assert session.live_bar(rd, conf, two_hosts, env) is None and layout.ENV_CONSOLE_RECORDS not in env
    bar = session.live_bar(rd, conf, one_host, env)
    assert env[layout.ENV_CONSOLE_RECORDS] == bar.path == str(tmp_path / layout.CONSOLE_RECORDS)


# -- issue 43: every frame on one line at any width, the bar never behind a printed line, the task's metrics --------

WIDTHS = (60, 80, 100, 120)


def _run_records(total: int = 48, val_every: int = 16) -> list[dict]:
    """A run's records as rank 0 writes them: start-up stages, the start, a step record every ~0.1 s (so, held
    back, not every step), a validation with an extra metric every ``val_every`` steps, a warning line."""
    recs: list[dict] = [{"kind": "stage", "text": "importing torch"}, {"kind": "stage", "text": "first step"},
                        {"kind": "start", "total": total, "start": 0, "unit": "samples/s"}]
    for step in range(1, total + 1):
        if step % 3 == 0 or step % val_every == 0 or step == total:
            recs.append({"t": 1000.0 + 0.05 * step, "kind": "step", "step": step, "total": total,
                         "loss": 1.0 / step, "rate": 12895.2})
        if step % val_every == 0:
            recs.append({"kind": "val", "step": step, "loss": 0.5 / step, "metrics": {"val/accuracy": 0.99609375}})
        if step == 20:
            recs.append({"kind": "line", "text": "warning: a checkpoint was passed over"})
    return recs


def _drawn(tmp_path, width: int, recs: list[dict], per_tick: int = 4) -> tuple[live_screen.Screen, str]:
    """``recs`` written to rank 0's record file ``per_tick`` at a time, each batch read by one tick, as the driver
    does, on a ``width``-column terminal; what the terminal shows."""
    from rich.console import Console

    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=width, color_system="standard")
    path = tmp_path / f"console-{width}.jsonl"
    path.write_text("")
    bar = live.Live(str(path), "mytask · 2 ranks", console=console)
    bar.start()
    for i in range(0, len(recs), per_tick):
        with open(path, "a") as f:
            f.writelines(json.dumps(r) + "\n" for r in recs[i:i + per_tick])
        bar.tick()
    bar.stop()
    return live_screen.read(out.getvalue()), out.getvalue()


@pytest.mark.parametrize("width", WIDTHS)
def test_every_frame_fits_one_line_and_the_bar_is_never_behind_a_printed_line(tmp_path, width):
    """Items 1 and 2: at 80 and 100 columns the elapsed time and ETA wrapped onto rows of their own (5 rows once
    the validation loss was shown, the bar one character wide); the bar lagged the validation lines printed above
    it (``step 17/60`` under ``step 20/60 val loss``)."""
    screen, raw = _drawn(tmp_path, width, _run_records())
    assert live_screen.problems(screen, width) == [], raw[-3000:]
    assert screen.frames and all("step " in f and "loss " in f for f in screen.frames[screen.frames.index(next(
        f for f in screen.frames if "loss " in f)):]), "once a step is done, the step and the loss always stay"
    assert "step 48/48" in screen.frames[-1] and not screen.frames[-1].endswith("…"), screen.frames[-1]
    assert "━" in screen.frames[-1], "the bar itself has room at every width"
    assert "start-up: starting the workers" in screen.frames[0]


@pytest.mark.parametrize("width", WIDTHS)
def test_the_tasks_metrics_after_each_validation_and_in_the_bar_when_there_is_room(tmp_path, width):
    """Item 3: docs/own-task.md says the extra metrics appear on the console after each validation: in the line
    printed, and in the bar where it has room (120 columns: yes; 60: the step, losses and bar come first)."""
    screen, _ = _drawn(tmp_path, width, _run_records())
    assert [line for line in screen.lines if "val loss" in line] == [
        f"  step {s}/48  val loss {0.5 / s:.4f}  val accuracy 0.9961" for s in (16, 32, 48)]
    assert any("val accuracy 0.9961" in f for f in screen.frames) == (width >= 100)


def test_a_validation_line_moves_the_bar_to_its_step_at_once(tmp_path):
    """Item 2 as reported: the bar drawn at step 17, then step 20's validation and step 40's printed in one tick;
    each line is followed by the bar at its own step, and the last frame is the last step's."""
    recs = [{"kind": "start", "total": 60, "start": 0, "unit": "samples/s"},
            {"t": 1.0, "kind": "step", "step": 17, "total": 60, "loss": 0.9, "rate": 100.0}]
    later = [{"t": 1.5, "kind": "step", "step": 20, "total": 60, "loss": 0.8, "rate": 100.0},
             {"kind": "val", "step": 20, "loss": 0.7, "metrics": {}},
             {"kind": "val", "step": 40, "loss": 0.6, "metrics": {}},  # its step record held back (too soon)
             {"t": 3.0, "kind": "step", "step": 47, "total": 60, "loss": 0.5, "rate": 100.0},
             {"t": 3.5, "kind": "step", "step": 60, "total": 60, "loss": 0.4, "rate": 100.0}]
    screen, raw = _drawn(tmp_path, 100, recs + later, per_tick=2)
    assert live_screen.problems(screen, 100) == [], raw[-2000:]
    after = [next(f for k, f in screen.events[i + 1:] if k == "frame") for i, (k, t) in enumerate(screen.events)
             if k == "line" and "val loss" in t]
    assert [live_screen.step_of(f) for f in after] == [20, 40], after
    assert "step 60/60" in screen.frames[-1]


def test_fields_drop_by_priority_step_and_loss_stay():
    """Item 1's rule, on the frame's fields alone: the ETA goes first, then the rate, the elapsed time, the extra
    metrics, the label, the validation loss, the spinner, and at last the bar; the step and the loss stay."""
    from ddp_runner.console import live_frame

    state = {"step": 16, "total": 48, "loss": 0.1376, "rate": 12895.2, "unit": "samples/s", "val": 0.1153,
             "metrics": {"val/accuracy": 0.99609}}
    fields = live_frame.fields(state, "mytask · 2 ranks", 12.0, 3.0, finished=False)
    seen = []
    for width in range(200, 10, -1):
        kept, bar = live_frame.layout(fields, width)
        assert live_frame.text_width(kept) + bar <= width or {f.key for f in kept} == {"steps", "loss"}
        keys = [f.key for f in kept if f.key != "bar"] + (["bar"] if bar else [])
        assert "steps" in keys and "loss" in keys
        gone = [k for k in ("eta", "rate", "elapsed", "metric", "label", "val", "spinner", "bar") if k not in keys]
        if not seen or gone != seen[-1]:
            seen.append(gone)
    assert seen[-1] == ["eta", "rate", "elapsed", "metric", "label", "val", "spinner", "bar"]
    assert all(later[:len(earlier)] == earlier for earlier, later in zip(seen, seen[1:], strict=False)), seen
    assert live_frame.remaining_s([(0.0, 10), (2.0, 20)], 48) == pytest.approx(5.6)
    assert live_frame.remaining_s([(0.0, 10)], 48) is None


def test_a_resize_redraws_the_bar_at_the_new_width(tmp_path):
    """Item 1: the display is redrawn when the terminal is resized (SIGWINCH), at the new width; a terminal of
    its own here (a pseudo-terminal), read back from its other end."""
    import fcntl
    import os
    import pty
    import signal
    import struct
    import termios
    import time

    from rich.console import Console

    def size(fd: int, columns: int) -> None:
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))

    master, slave = pty.openpty()
    size(slave, 120)
    tty = os.fdopen(slave, "w", buffering=1)
    received = bytearray()

    def drain(seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            ready, _, _ = select.select([master], [], [], 0.05)
            if ready:
                received.extend(os.read(master, 65536))

    path = tmp_path / "console.jsonl"
    bar = live.Live(str(path), "mytask · 2 ranks", console=Console(file=tty, force_terminal=True))
    path.write_text("".join(json.dumps(r) + "\n" for r in _run_records()[:12]))
    try:
        bar.start()
        bar.tick()
        drain(0.3)
        marker = len(received)
        size(master, 60)
        os.kill(os.getpid(), signal.SIGWINCH)
        drain(0.15)  # less than the 0.25 s between two redraws: this one is the resize's
        resized = live_screen.read(received[marker:].decode("utf-8", "replace") + "\x1b[?25h")
        bar.stop()
    finally:
        tty.close()
        os.close(master)
    before = live_screen.read(received[:marker].decode("utf-8", "replace") + "\x1b[?25h")
    assert max(len(f) for f in before.frames) > 60, before.frames  # it was using the 120 columns
    assert resized.frames and live_screen.problems(resized, 60) == [], resized
    assert all("step 18/48" in f for f in resized.frames), resized.frames
    assert signal.getsignal(signal.SIGWINCH) in (signal.SIG_DFL, None) or not callable(
        signal.getsignal(signal.SIGWINCH)), "the driver's handler is gone with the bar"


def test_rank_0_reports_the_tasks_metrics_with_each_validation(tmp_path, monkeypatch):
    """Item 3, rank 0's side: the validation record carries the task's extra metrics for the bar, and a plain
    console (piped output) prints them in the validation line."""
    out = _Pipe()
    p = progress.Progress(out, total=20)
    p.validated(20, 0.70123, {"val/accuracy": 0.99609375})
    assert out.getvalue() == "  step 20/20  val loss 0.7012  val accuracy 0.9961\n"
    path = tmp_path / "console.jsonl"
    monkeypatch.setenv("DDP_RUNNER_CONSOLE_RECORDS", str(path))
    console = progress.open_console(str(tmp_path))
    progress.Progress(console, total=20).validated(20, 0.70123, {"val/accuracy": 0.99609375})
    console.close()
    assert _records(path)[-1] == {**_records(path)[-1], "kind": "val", "metrics": {"val/accuracy": 0.99609375}}
    assert live.val_line(20, 20, 0.70123, {"val/accuracy": 0.99609375}) == out.getvalue().rstrip("\n")
