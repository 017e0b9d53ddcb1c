"""Rank 0's progress on the user's console: plain step lines, or records that the driver draws as a live bar.

Under a terminal the driver draws the bar (runner/console/live.py) and tells rank 0 so through
``DDP_RUNNER_CONSOLE_RECORDS``: rank 0's console is then a :class:`RecordConsole`, whose every line and progress
update is one JSON line in ``logs/console.jsonl``. Otherwise (output piped to a file or a CI log) rank 0 writes a
few plain ``step N/M`` lines itself; when that console's reader goes away (``ddp-run … | head``), or it is the null
device, the lines go on in rank 0's log (``logs/rank0.log``) and training goes on.
"""

from __future__ import annotations

import io
import json
import os
import sys
import time
from collections.abc import Mapping
from typing import IO, Any

from ddp_runner.contract import console_streams, layout

# Said once in rank 0's log where its console lines go on.
CONSOLE_GONE = ("console: the user's console cannot be written (its reader went away, or it is the null device);"
                " rank 0's console lines go on here\n")

# Progress records at most this often (the driver reads them twice a second); the last step always.
RECORD_EVERY_S = 0.1


class RecordConsole(io.TextIOBase):
    """The user's console while the driver draws it: each complete line written becomes a ``{"line": …}``
    record, and :meth:`record` adds progress records (``start``, ``step``, ``val``, ``stage``)."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self._file = open(path, "a", encoding="utf-8", buffering=1)  # noqa: SIM115 - lives as long as the rank
        self._partial = ""

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    def write(self, s: str) -> int:
        """Record each complete line of ``s`` (a partial one waits for its end)."""
        *lines, self._partial = (self._partial + s).split("\n")
        for line in lines:
            self.record("line", text=line)
        return len(s)

    def record(self, kind: str, **fields: Any) -> None:
        """Append one record: ``{"t": <Unix seconds>, "kind": kind, **fields}``."""
        self._file.write(json.dumps({"t": round(time.time(), 3), "kind": kind, **fields}) + "\n")

    def flush(self) -> None:
        if not self._file.closed:
            self._file.flush()

    def close(self) -> None:
        if self._partial:
            self.write("\n")
        super().close()
        self._file.close()


def open_console(local_dir: str) -> IO[str]:
    """Rank 0's console: records for the driver's bar when the driver asked for them, else a copy of stdout that
    never fails the rank. Called before stdout goes to the rank log (tasks/engine/worker_io.py): a closed console
    then goes on in that log (its descriptor 1 by then)."""
    path = os.environ.get(layout.ENV_CONSOLE_RECORDS)
    if path:
        return RecordConsole(path if os.path.isabs(path) else os.path.join(local_dir, path))
    return console_streams.forgiving(os.dup(1), _to_rank_log, CONSOLE_GONE, getattr(sys.stdout, "encoding", None))


def _to_rank_log(fd: int) -> None:
    os.dup2(1, fd)


def stage(console: IO[str] | None, text: str) -> None:
    """Tell the driver's bar what the start-up is doing now (plain consoles get nothing: it would be noise)."""
    if isinstance(console, RecordConsole):
        console.record("stage", text=text)


def metric_text(name: str, value: float) -> str:
    """A task's extra validation metric on the console: ``val accuracy 0.9961`` (the driver's bar words it the
    same: runner/console/live_frame.py)."""
    shown = f"{value:.4f}" if abs(value) < 1000 else f"{value:,.1f}"
    return f"val {name.removeprefix('val/')} {shown}"


def rate_text(rate: float, unit: str) -> str:
    """A throughput with its unit: ``63,606 tokens/s``."""
    return f"{rate:,.0f} {unit}"


class Progress:
    """Optimizer steps, loss and throughput (``unit``: ``tokens/s`` or ``samples/s``), and validation losses.
    Writes nothing when there is no console."""

    def __init__(self, console: IO[str] | None, total: int, start: int = 0, unit: str = "samples/s") -> None:
        self.console, self.total, self.unit, self.last_line = console, total, unit, start
        self.records = console if isinstance(console, RecordConsole) else None
        self.every = max(1, total // 10)
        self.last_record = 0.0
        self.held: dict[str, Any] | None = None  # a step update not yet recorded (too soon after the last)
        if self.records is not None:
            self.records.record("start", total=total, start=start, unit=unit)

    def update(self, step: int, loss: float, rate: float) -> None:
        """Report that ``step`` optimizer steps are done, at ``rate`` (in ``unit``)."""
        if self.records is not None:
            self.held = {"step": step, "total": self.total, "loss": loss, "rate": rate}
            now = time.monotonic()
            if now - self.last_record >= RECORD_EVERY_S or step == self.total:
                self._release(now)
        elif self.console is not None and (step - self.last_line >= self.every or step == self.total):
            self.last_line = step
            self.console.write(f"  step {step}/{self.total}  loss {loss:.4f}  {rate_text(rate, self.unit)}\n")
            self.console.flush()

    def _release(self, now: float) -> None:
        if self.records is not None and self.held is not None:
            self.records.record("step", **self.held)
            self.held, self.last_record = None, now

    def validated(self, step: int, loss: float, metrics: Mapping[str, float] | None = None) -> None:
        """Report a validation loss computed after ``step`` optimizer steps, and the task's extra metrics over the
        same samples (``{"val/accuracy": 0.99}``)."""
        metrics = dict(metrics or {})
        if self.records is not None:
            self._release(time.monotonic())  # the bar shows the step this loss belongs to
            self.records.record("val", step=step, loss=loss, metrics=metrics)
        elif self.console is not None:
            self.console.write(f"  step {step}/{self.total}  val loss {loss:.4f}"
                               + "".join(f"  {metric_text(k, v)}" for k, v in metrics.items()) + "\n")
            self.console.flush()

    def phase(self, name: str | None) -> None:
        """Tell the driver's bar that a phase other than training (``validation``) began, or ended (None). A plain
        console gets nothing: its validation line follows soon enough."""
        if self.records is not None:
            self._release(time.monotonic())  # the bar shows the step the phase follows
            self.records.record("phase", name=name)

    def close(self) -> None:
        """Record the last step held back, if any."""
        self._release(time.monotonic())
