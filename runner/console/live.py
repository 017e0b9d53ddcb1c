"""A live terminal: while a run trains, the driver draws rank 0's progress as a bar (``rich``) on the user's TTY.

The driver owns the terminal: it asks rank 0 (``DDP_RUNNER_CONSOLE_RECORDS``) to write its console as records
into ``logs/console.jsonl`` (tasks/engine/progress.py) and reads them on every supervision tick. The bar is drawn
from the driver's first second on, start-up included, and redrawn four times a second whether or not a step has
ended: the elapsed time moves even while one step takes a minute. Rank 0's messages (validation losses and
metrics, warnings) and the driver's own lines are printed above the bar.

Every frame is one line that fits the terminal (runner/console/live_frame.py chooses its fields), redrawn at once
when the terminal is resized (SIGWINCH). Each record moves the bar before anything is printed, so that a printed
validation line is never ahead of the bar below it. Piped output gets no bar: rank 0 writes plain ``step N/M``
lines itself.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from ddp_runner.console import live_frame, textfit
from ddp_runner.console.live_frame import clock, figures, steps_text, times_text  # noqa: F401 - the bar's words
from ddp_runner.contract import layout
from ddp_runner.contract.osutil import handle_signals, restore_signals

REFRESH_PER_S = 4


def wanted(stream: IO[str]) -> bool:
    """Draw a bar on ``stream``? Only on a terminal that can redraw a line."""
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        return False
    return tty and os.environ.get("TERM", "") != "dumb"


def terminal_columns(stream: IO[str]) -> int | None:
    """The width of the terminal ``stream`` writes to, None when it is not one (the terminal's own size wins over
    ``COLUMNS``: it is what a resize changes)."""
    try:
        return os.get_terminal_size(stream.fileno()).columns or None
    except (AttributeError, ValueError, OSError):
        return None


class Live:
    """Rank 0's records drawn as a one-line bar on ``console`` (a rich Console; the driver's stdout by default)."""

    def __init__(self, path: str, label: str, console: Any = None, transient: bool = False) -> None:
        from rich.console import Console
        from rich.live import Live as RichLive
        from rich.spinner import Spinner

        self.path, self.label = path, label
        self.offset = os.path.getsize(path) if os.path.exists(path) else 0  # a continued run's earlier records
        self.partial = b""
        self.state: dict[str, Any] = {"step": 0, "total": None, "unit": None, "stage": "starting the workers"}
        self.paces: deque[tuple[float, int]] = deque()  # rank 0's (time, step): the ETA's pace
        self.t0, self.finished = time.monotonic(), False
        self.console = console or Console(file=sys.stdout)
        self.spinner = Spinner("dots", style="progress.spinner")
        # The driver's own lines above the bar; its stderr only when that is the same terminal (2>file stays).
        self.live = RichLive(self, console=self.console, refresh_per_second=REFRESH_PER_S, transient=transient,
                             redirect_stdout=True, redirect_stderr=wanted(sys.stderr))
        self._resized = threading.Event()
        self._ended = False
        self._previous_winch: Any = None

    @classmethod
    def for_run(cls, local_dir: str, label: str, transient: bool = False) -> Live:
        """The bar for the run whose local directory is ``local_dir`` (``transient``: gone when it stops)."""
        return cls(str(Path(local_dir, layout.CONSOLE_RECORDS)), label, transient=transient)

    # -- drawing -------------------------------------------------------------------------------------------------

    def __rich_console__(self, console: Any, options: Any) -> Any:
        """The frame now, fitted to the console's width (rich calls this at every redraw)."""
        from rich.progress_bar import ProgressBar
        from rich.text import Text

        now = time.monotonic()
        remaining = None if self.finished else live_frame.remaining_s(self.paces, self.state.get("total"))
        kept, bar = live_frame.layout(live_frame.fields(self.state, self.label, now - self.t0, remaining,
                                                        self.finished), options.max_width)
        line = Text(no_wrap=True, overflow="ellipsis", end="")
        for key, text, style in live_frame.pieces(kept):
            if key == "bar":
                total = self.state.get("total")
                drawn = ProgressBar(total=total, completed=self.state.get("step") or 0, width=bar,
                                    pulse=not total, animation_time=now)
                line.append_text(Text.assemble(*((s.text, s.style) for s in console.render(drawn, options)
                                                 if not s.control)))
            elif key == "spinner":  # its frame of the moment
                line.append_text(self.spinner.render(now))
            else:
                line.append(text, style=style)
        line.truncate(options.max_width, overflow="ellipsis")  # only a terminal narrower than step and loss
        yield line

    def refresh(self) -> None:
        """Draw the frame now."""
        self.live.refresh()

    def start(self) -> None:
        """Start drawing (and redirect the driver's own prints above the bar); redraw on every resize."""
        self._fit_terminal()
        self.live.start(refresh=True)
        try:
            self._previous_winch = handle_signals((signal.SIGWINCH,), lambda *_: self._resized.set())
        except (ValueError, AttributeError):  # not the main thread, or no SIGWINCH (Windows): the next redraw
            self._previous_winch = None
        else:
            threading.Thread(target=self._redraw_on_resize, name="ddp-run-live-resize", daemon=True).start()

    def stop(self) -> None:
        """Read the last records, draw the final frame and give the terminal back."""
        self.tick()
        self.finished = True
        if self._previous_winch is not None:  # first: the handler must not interrupt the set() below
            restore_signals(self._previous_winch)
        self._ended = True
        self._resized.set()
        self.live.stop()

    def _fit_terminal(self) -> None:
        """The console's width from the terminal it draws on (a resize changes it; COLUMNS does not follow)."""
        if (columns := terminal_columns(self.console.file)) is not None:
            self.console.width = columns

    def _redraw_on_resize(self) -> None:
        # A thread, not the signal handler, redraws: the handler may interrupt the main thread inside a print.
        while True:
            self._resized.wait()
            self._resized.clear()
            if self._ended:
                return
            self._fit_terminal()
            self.refresh()

    # -- records -------------------------------------------------------------------------------------------------

    def tick(self) -> None:
        """Apply the records rank 0 added since the last tick, and draw the bar they leave."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return  # rank 0 has not started yet
        self.offset += len(data)
        *lines, self.partial = (self.partial + data).split(b"\n")
        for line in lines:
            try:
                self.apply(json.loads(line))
            except (ValueError, TypeError, KeyError):
                continue  # not a record (a torn write): the next one says more
        if lines:
            self.refresh()

    def apply(self, rec: Mapping[str, Any]) -> None:
        """One record: ``start``, ``step``, ``val``, ``stage``, ``phase`` or a ``line`` to print above the bar. The
        state moves first: a line printed is followed by the bar as the record left it."""
        kind, s = rec.get("kind"), self.state
        if kind == "line":
            self.say(rec["text"])
        elif kind == "stage":
            s["stage"] = rec["text"]
        elif kind == "phase":  # a validation under way (None: over)
            s["phase"] = rec.get("name")
        elif kind == "start":
            s.update(total=rec["total"], step=rec["start"], unit=rec.get("unit"))
            self.paces.clear()  # a resumed run's first steps are not progress made in no time (the ETA)
        elif kind == "step":
            s.update(step=rec["step"], total=rec["total"], loss=rec["loss"], rate=rec["rate"], phase=None)
            self._pace(rec.get("t"), rec["step"])
        elif kind == "val":
            s.update(step=max(s.get("step") or 0, rec["step"]), val=rec["loss"], metrics=rec.get("metrics") or {},
                     phase=None)
            self.say(val_line(rec["step"], s.get("total"), rec["loss"], s["metrics"]))

    def _pace(self, t: float | None, step: int) -> None:
        """Remember rank 0's time of ``step`` for the ETA (the last ``ETA_WINDOW_S`` seconds of them)."""
        if t is None:
            return
        self.paces.append((float(t), step))
        while self.paces and self.paces[0][0] < t - live_frame.ETA_WINDOW_S:
            self.paces.popleft()

    def say(self, text: str) -> None:
        """Print a line above the bar, as written (no markup), fitted to the terminal's width."""
        from rich.text import Text

        for line in textfit.fit_lines(text, self.console.width):
            self.console.print(Text(line), soft_wrap=True)


def val_line(step: int, total: int | None, loss: float, metrics: Mapping[str, float]) -> str:
    """The line printed above the bar after a validation: ``  step 16/48  val loss 0.1153  val accuracy 0.9961``
    (rank 0's plain console prints the same: tasks/engine/progress.py)."""
    where = f"step {step}/{total}" if total else f"step {step}"
    return f"  {where}  val loss {loss:.4f}" + "".join(f"  {live_frame.metric_text(k, v)}" for k, v in metrics.items())
