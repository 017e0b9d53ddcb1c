"""A live terminal (runner/launch/live.py): the real CLI under a pseudo-terminal draws a progress bar from its first
second on, redrawn at least once a second while a step takes longer than that, with the step, the loss, the rate
with its unit and the ETA; the driver's closing lines follow the bar. (Piped output keeps plain ``step N/M``
lines: tests/e2e/test_smoke.py.)"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import sys
import tempfile
import termios
import time
from pathlib import Path

from conftest import load_json, run_dirs

from ddp_runner.contract import layout

FRAME = re.compile(rb"\r\x1b\[2K")  # rich redraws its line: carriage return, erase the line
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def run_in_pty(args: list[str], root: Path, timeout: float = 240) -> tuple[int, list[tuple[float, bytes]]]:
    """``python -m ddp_runner <args>`` with stdin, stdout and stderr on a 120×40 pseudo-terminal; its exit code and
    what it wrote, in the chunks it arrived in, each with its arrival time (seconds from the start)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "120"}
    proc = subprocess.Popen([sys.executable, "-m", "ddp_runner", *args, f"output.root={root}"], stdin=slave,
                            stdout=slave, stderr=slave, cwd=tempfile.gettempdir(), env=env, start_new_session=True)
    os.close(slave)
    t0, chunks = time.monotonic(), []
    try:
        while time.monotonic() - t0 < timeout:
            ready, _, _ = select.select([master], [], [], 0.1)
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
