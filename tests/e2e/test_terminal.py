"""A live terminal (runner/console/live.py): the real CLI under a pseudo-terminal draws a progress bar from its first
second on, redrawn at least once a second while a step takes longer than that, with the step, the loss, the rate
with its unit and the ETA; the driver's closing lines follow the bar. (Piped output keeps plain ``step N/M``
lines: tests/e2e/test_smoke.py.)"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import tempfile
import termios
import time
from collections.abc import Sequence
from pathlib import Path

from ddp_runner.contract import layout
from tests.support import live_screen
from tests.support.recipes import rank0_sleeps
from tests.support.run_tree import load_json, run_dirs

FRAME = re.compile(rb"\r\x1b\[2K")  # rich redraws its line: carriage return, erase the line
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def run_in_pty(args: list[str], root: Path, timeout: float = 240, columns: int = 120, cwd: Path | None = None,
               resizes: Sequence[int] = (), resized: list[tuple[int, int]] | None = None,
               ) -> tuple[int, list[tuple[float, bytes]]]:
    """``python -m ddp_runner <args>`` with stdin, stdout and stderr on a ``columns``×40 pseudo-terminal; its exit
    code and what it wrote, in the chunks it arrived in, each with its arrival time (seconds from the start).

    ``resizes``: widths the terminal takes in turn once the bar shows a training loss, 0.8 s apart (a window
    manager's resize: the new size, then SIGWINCH to the driver); each is noted in ``resized`` as (the number of
    chunks received before it, the width)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": str(columns)}
    proc = subprocess.Popen([sys.executable, "-m", "ddp_runner", *args, f"output.root={root}"], stdin=slave,
                            stdout=slave, stderr=slave, cwd=cwd or tempfile.gettempdir(), env=env,
                            start_new_session=True)
    os.close(slave)
    t0, chunks, pending, last_resize = time.monotonic(), [], list(resizes), 0.0
    try:
        while time.monotonic() - t0 < timeout:
            if pending and time.monotonic() - last_resize > 0.8 and any(b"loss " in d for _, d in chunks[-3:]):
                fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", 40, pending[0], 0, 0))
                os.kill(proc.pid, signal.SIGWINCH)  # its own session: no controlling terminal to send it
                (resized if resized is not None else []).append((len(chunks), pending.pop(0)))
                last_resize = time.monotonic()
            ready, _, _ = select.select([master], [], [], 0.05)
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:  # the child side closed (Linux: EIO)
                    break
                if not data:
                    break
                chunks.append((time.monotonic() - t0, data))
            elif proc.poll() is not None:
                break
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
    return proc.wait(timeout=30), chunks


def frames(chunks: list[tuple[float, bytes]]) -> list[tuple[float, str]]:
    """Every redraw of the bar's line, as text without colours, with the time its chunk arrived."""
    out = []
    for t, data in chunks:
        for piece in FRAME.split(data)[1:]:
            out.append((t, ANSI.sub("", piece.decode("utf-8", "replace")).split("\r\n")[0]))
    return out


def test_a_bar_under_a_terminal_redrawn_every_second_while_a_step_takes_longer(tmp_path):
    # Rank 0 sleeps 2.5 s after steps 2 and 3 (a rehearsal fault): steps far longer than a second. An 8 s hang
    # watchdog: the same run shows that a slow rank below the watchdog is not a hang (for
    # tests/e2e/test_diagnostics_e2e.py).
    code, chunks = run_in_pty(["task=smoke", "device=cpu", "world_size=2", "train.max_steps=4", "fault.kind=slow",
                               "fault.rank=0", "fault.step=2", "fault.slow_s=2.5", "watchdog.timeout_s=8"],
                              tmp_path / "outputs")
    text = b"".join(d for _, d in chunks).decode("utf-8", "replace")
    assert code == 0, text
    [run] = run_dirs(tmp_path / "outputs")
    assert not (run / layout.HANG_RECORD).exists(), "a slow rank below the watchdog is not a hang"
    assert not (run / layout.STACKS).exists(), "the empty stack files are tidied away"
    drawn = frames(chunks)
    # From the first second on, start-up included: the bar is there before rank 0 has started.
    assert drawn and drawn[0][0] < 5.0 and "start-up: starting the workers" in drawn[0][1], drawn[:3]
    assert all("smoke · 2 ranks" in f for _, f in drawn)
    # The start-up says what it is doing (torch's import alone takes seconds).
    assert any("start-up: importing torch" in f for _, f in drawn), drawn[:20]
    # While step 3 (then 4) is under way, the bar keeps being redrawn, at least once a second: the elapsed time
    # moves although the step count does not.
    slow = [(t, f) for t, f in drawn if "step 2/4" in f or "step 3/4" in f]
    assert slow and slow[-1][0] - slow[0][0] > 3.0, slow
    gaps = [b - a for (a, _), (b, _) in zip(slow, slow[1:], strict=False)]
    assert max(gaps) <= 1.0, max(gaps)
    assert len({re.search(r"elapsed (\S+)", f).group(1) for _, f in slow}) >= 3
    # The figures carry their units, and an ETA once the rate is known.
    assert any(re.search(r"step 3/4 +loss \d\.\d{4} · [\d,]+ samples/s", f) for _, f in slow), slow
    assert any("ETA " in f for _, f in slow)
    last = drawn[-1][1]
    assert "step 4/4" in last and "samples/s" in last
    # The recorded console (what the driver drew from) and the closing lines after the bar.
    records = (run / "logs" / "console.jsonl").read_text()
    assert '"kind": "start"' in records and '"step": 4' in records
    summary = load_json(run / "summary.json")
    assert summary["status"] == "completed" and summary["steps"] == 4
    tail = ANSI.sub("", text.split("step 4/4")[-1])
    assert f"ddp-run: completed: 4 steps, 2 ranks on distinct devices (cpu:0, cpu:1), final loss" \
           f" {summary['final']['train/loss']:.4f}" in tail
    assert tail.strip().splitlines()[-1] == str(run), "the run directory is still the last line"


WIDTHS = (60, 80, 100, 120)


def _replayed(records: list[dict], width: int) -> live_screen.Screen:
    """A run's records drawn in process as the driver draws them (a few per tick), on a ``width``-column
    terminal."""
    import io

    from rich.console import Console

    from ddp_runner.console.live import Live

    out = io.StringIO()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "console.jsonl")
        path.write_text("")
        bar = Live(str(path), "mytask · 2 ranks", console=Console(file=out, force_terminal=True, width=width))
        bar.start()
        for i in range(0, len(records), 3):
            with open(path, "a") as f:
                f.writelines(json.dumps(r) + "\n" for r in records[i:i + 3])
            bar.tick()
        bar.stop()
    return live_screen.read(out.getvalue())


def test_the_bar_fits_every_width_through_validation_metrics_and_resizes(tmp_path):
    """Issue 43, items 1-4 and 10, on one launch: docs/own-task.md's task (an MLP whose forward returns an
    accuracy; 48 steps, validated at steps 16, 32 and 48) under a 100-column terminal, resized to 60 columns once
    the bar shows a loss and to 80 after that; rank 0 sleeps 50 ms after every step, so that training lasts a
    few seconds. Its records are then drawn again in process at 60, 80, 100 and 120 columns."""
    from tests.support.doc_commands import shown_files

    work = tmp_path / "work"
    for name, body in shown_files(Path(__file__).resolve().parents[2] / "docs" / "own-task.md").items():
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        (work / name).write_text(body)
    resized: list[tuple[int, int]] = []
    code, chunks = run_in_pty(["--config-dir", "conf", "task=mytask", "device=cpu", "world_size=2",
                               *rank0_sleeps(0.05)],
                              tmp_path / "outputs", columns=100, cwd=work, resizes=(60, 80), resized=resized)
    text = b"".join(d for _, d in chunks).decode("utf-8", "replace")
    assert code == 0, text
    [run] = run_dirs(tmp_path / "outputs")
    assert [w for _, w in resized] == [60, 80], "the bar showed a loss for long enough to be resized twice"
    # Every frame on one line of the terminal as it was, redrawn at the new width when it changed (a frame or
    # two in flight at the old one); every validation line followed by the bar at its step; the final step last.
    screen = live_screen.read(text)
    assert live_screen.problems(screen, 100) == [], text[-4000:]
    bounds = [0, *(i for i, _ in resized), len(chunks)]
    for (start, end), width in zip(zip(bounds, bounds[1:], strict=False), (100, 60, 80), strict=True):
        part = "\x1b[?25l" + b"".join(d for _, d in chunks[start:end]).decode("utf-8", "replace")
        frames = live_screen.read(part + ("" if end == len(chunks) else "\x1b[?25h")).frames
        assert frames and all(len(f) <= width for f in frames[2:]), (width, frames)
    assert "step 48/48" in screen.frames[-1] and "loss " in screen.frames[-1], screen.frames[-1]
    assert not screen.frames[-1].endswith("…") and len(screen.frames[-1]) <= 80
    # The task's metric after each validation (item 3), as rank 0's log has it.
    val = [line for line in screen.lines if "val loss" in line]
    assert [live_screen.step_of(line) for line in val] == [16, 32, 48], val
    assert all(re.search(r"val accuracy [01]\.\d{4}$", line) for line in val), val
    # The closing account fits the 80 columns the terminal had by then (item 4); the run directory, a path, last.
    closing = ANSI.sub("", text[text.rindex("\x1b[?25h"):]).replace("\r\n", "\n").strip().splitlines()
    assert closing[0].startswith("ddp-run: completed: 48 steps") and closing[-1] == str(run), closing
    assert all(len(line) <= 80 for line in closing[:-1]), [line for line in closing if len(line) > 80]
    # The same records drawn at each width: one line per frame, never behind a printed line, the last step last.
    records = [json.loads(line) for line in (run / "logs" / "console.jsonl").read_text().splitlines()]
    for width in WIDTHS:
        drawn = _replayed(records, width)
        assert live_screen.problems(drawn, width) == [], (width, drawn.frames)
        assert "step 48/48" in drawn.frames[-1] and any("val accuracy" in f for f in drawn.frames) == (width >= 100)
    # Three validations ran (steps 16, 32, 48). What one costs against a training pass (item 10) is a speed figure:
    # BENCHMARKS.md, "2026-12-03"; its cause (inductor imported by validation) is tested in test_val_compile.py.
    assert load_json(run / "summary.json")["validation"]["runs"] == 3
