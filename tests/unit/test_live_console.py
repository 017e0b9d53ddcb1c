"""The live terminal's pieces: rank 0's console (tasks/engine/progress.py) as plain lines or as records, and the
driver's bar drawn from those records (runner/launch/live.py) into a terminal-like rich console."""

from __future__ import annotations

import io
import json

from ddp_runner.launch import live
from ddp_runner.tasks.engine import progress


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
    bar.progress.refresh()
    assert "start-up: starting the workers" in out.getvalue() and "elapsed 0:0" in out.getvalue()
    with open(path, "a") as f:
        for rec in ({"kind": "stage", "text": "first step"}, {"kind": "start", "total": 8, "start": 0,
                                                               "unit": "tokens/s"},
                    {"kind": "step", "step": 3, "total": 8, "loss": 0.5, "rate": 63606.4}):
            f.write(json.dumps(rec) + "\n")
        f.write('{"kind": "val", "step": 4, "loss": 0.45')  # half a record: waits for its end
    bar.tick()
    bar.progress.refresh()
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
    from ddp_runner.launch import session

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
