"""A live terminal: while a run trains, the driver draws rank 0's progress as a bar (``rich``) on the user's TTY.

The driver owns the terminal: it asks rank 0 (``DDP_RUNNER_CONSOLE_RECORDS``) to write its console as records
into ``logs/console.jsonl`` (tasks/engine/progress.py) and reads them on every supervision tick. The bar is drawn
from the driver's first second on, start-up included, and redrawn four times a second whether or not a step has
ended: the elapsed time moves even while one step takes a minute. Rank 0's messages (validation losses,
warnings) and the driver's own lines are printed above the bar. Piped output gets no bar: rank 0 writes plain
``step N/M`` lines itself.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from ddp_runner.contract import layout

REFRESH_PER_S = 4


def wanted(stream: IO[str]) -> bool:
    """Draw a bar on ``stream``? Only on a terminal that can redraw a line."""
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        return False
    return tty and os.environ.get("TERM", "") != "dumb"


def figures(state: Mapping[str, Any]) -> str:
    """The bar's figures with their units: ``loss 0.7276 · 63,606 tokens/s · val loss 0.7012``."""
    out = []
    if state.get("loss") is not None:
        out.append(f"loss {state['loss']:.4f}")
    if state.get("rate") is not None:
        out.append(f"{state['rate']:,.0f} {state.get('unit') or 'samples/s'}")
    if state.get("val") is not None:
        out.append(f"val loss {state['val']:.4f}")
    return " · ".join(out)


def clock(seconds: float | None) -> str:
    """``1:02:03``, ``2:03``; ``-`` when unknown."""
    if seconds is None:
        return "-"
    m, sec = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"


def times_text(elapsed: float | None, remaining: float | None, finished: bool) -> str:
    """``elapsed 0:14 · ETA 2:03`` (no ETA before it can be estimated, nor once finished)."""
    out = f"elapsed {clock(elapsed)}"
    return out if finished or remaining is None else f"{out} · ETA {clock(remaining)}"


def _times_column(t0: float) -> Any:
    """Elapsed since ``t0`` (the driver's launch, start-up included; monotonic seconds) and the task's ETA."""
    from rich.progress import ProgressColumn
    from rich.text import Text

    class Times(ProgressColumn):
        max_refresh = None  # the elapsed time moves at every redraw

        def render(self, task: Any) -> Text:
            return Text(times_text(time.monotonic() - t0, task.time_remaining, task.finished),
                        style="progress.elapsed")

    return Times()


def steps_text(step: int, total: int | None) -> str:
    """``step 3/8`` (``step 3`` while the total is unknown)."""
    return f"step {step}/{total}" if total else (f"step {step}" if step else "")


class Live:
    """Rank 0's records drawn as a bar on ``console`` (a rich Console; the driver's stdout by default)."""

    def __init__(self, path: str, label: str, console: Any = None) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn

        self.path = path
        self.offset = os.path.getsize(path) if os.path.exists(path) else 0  # a continued run's earlier records
        self.partial = b""
        self.state: dict[str, Any] = {"step": 0, "total": None, "unit": None}
        self.progress = Progress(
            SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[steps]}"),
            TextColumn("{task.fields[figures]}"), _times_column(time.monotonic()),
            console=console or Console(file=sys.stdout), refresh_per_second=REFRESH_PER_S, transient=False,
            # the driver's own lines above the bar; its stderr only when that is the same terminal (2>file stays)
            redirect_stdout=True, redirect_stderr=wanted(sys.stderr))
        self.task = self.progress.add_task(label, total=None, steps="", figures="start-up: starting the workers")

    @classmethod
    def for_run(cls, local_dir: str, label: str) -> Live:
        """The bar for the run whose local directory is ``local_dir``."""
        return cls(str(Path(local_dir, layout.CONSOLE_RECORDS)), label)

    def start(self) -> None:
        """Start drawing (and redirect the driver's own prints above the bar)."""
        self.progress.start()

    def stop(self) -> None:
        """Read the last records, draw the final frame and give the terminal back."""
        self.tick()
        self.progress.stop()

    def tick(self) -> None:
        """Apply the records rank 0 added since the last tick."""
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

    def apply(self, rec: Mapping[str, Any]) -> None:
        """One record: ``start``, ``step``, ``val``, ``stage`` or a ``line`` to print above the bar."""
        kind, s = rec.get("kind"), self.state
        if kind == "line":
            self.say(rec["text"])
            return
        if kind == "stage":
            self.progress.update(self.task, figures=f"start-up: {rec['text']}")
            return
        if kind == "start":
            s.update(total=rec["total"], step=rec["start"], unit=rec.get("unit"))
            # reset: a resumed run's first steps are not counted as progress made in no time (the ETA)
            self.progress.reset(self.task, total=rec["total"], completed=rec["start"])
        elif kind == "step":
            s.update(step=rec["step"], total=rec["total"], loss=rec["loss"], rate=rec["rate"])
            self.progress.update(self.task, completed=rec["step"], total=rec["total"])
        elif kind == "val":
            s["val"] = rec["loss"]
            self.say(f"  step {rec['step']}/{s['total']}  val loss {rec['loss']:.4f}")
        else:
            return
        self.progress.update(self.task, steps=steps_text(s["step"], s["total"]), figures=figures(s))

    def say(self, text: str) -> None:
        """Print a line above the bar, as written (no markup)."""
        from rich.text import Text

        self.progress.console.print(Text(text), soft_wrap=True)
