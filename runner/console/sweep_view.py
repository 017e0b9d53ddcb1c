"""One console view of a concurrent sweep: a row per running job (its devices, step, loss, throughput, time).

A sweep run in turn (:func:`in_turn`) has no view: each job says one line when it ends.

Each job's rank 0 writes its console as records (``tasks/engine/reporting/progress.py``) into a file the pool chose; the
view reads what was added at every poll. On a terminal the rows are redrawn in place (``rich``); piped, the view
prints one line when a job starts and one when it ends.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterable, Mapping
from typing import IO, Any

from ddp_runner.console import textfit
from ddp_runner.console.live import clock, figures, steps_text, wanted
from ddp_runner.console.live_frame import PHASES
from ddp_runner.contract import layout


def in_turn(sweep: Any, conf: Mapping[str, Any] | None = None) -> bool:
    """Is this a job of a sweep (``sweep``: its sweep, or whether it has one) that runs its jobs one after another
    in this process, on this host? Such a job says one line on the console when it ends, naming its run
    directory; its plan, run directory and progress stay in that directory (run.json, logs/console.jsonl). A
    concurrent sweep's job has the sweep's view instead (and its own log); a dry run shows every job's plan."""
    conf = conf or {}
    return (bool(sweep) and not os.environ.get(layout.ENV_SWEEP_CONSOLE) and not conf.get("dry_run")
            and (conf.get("launcher") or {}).get("name", "local") == "local")


class Records:
    """A job's console records read so far, as the state its row shows."""

    def __init__(self, path: str) -> None:
        self.path, self.offset, self.partial = path, 0, b""
        self.state: dict[str, Any] = {"step": 0, "total": None, "unit": None, "stage": "starting"}

    def read(self) -> dict[str, Any]:
        """Apply the records added since the last read; the state."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return self.state
        self.offset += len(data)
        *lines, self.partial = (self.partial + data).split(b"\n")
        for line in lines:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            kind, s = rec.get("kind"), self.state
            if kind == "stage":
                s["stage"] = rec.get("text")
            elif kind == "start":
                s.update(total=rec.get("total"), step=rec.get("start", 0), unit=rec.get("unit"), stage=None)
            elif kind == "step":
                s.update(step=rec.get("step", 0), total=rec.get("total"), loss=rec.get("loss"), rate=rec.get("rate"),
                         stage=None, phase=None)
            elif kind == "val":
                s.update(val=rec.get("loss"), phase=None)
            elif kind == "phase":  # a validation under way (None: over)
                s["phase"] = rec.get("name")
        return self.state


def where(child: Any) -> str:
    """``GPUs 0,1`` or ``cores 2-3``."""
    ids = list(child.ids)
    if child.kind == "gpu":
        return f"GPU{'s' if len(ids) != 1 else ''} {','.join(map(str, ids))}"
    run = len(ids) > 1 and ids == list(range(ids[0], ids[-1] + 1))
    span = f"{ids[0]}-{ids[-1]}" if run else ",".join(map(str, ids))
    return f"core{'s' if len(ids) != 1 else ''} {span}"


def values_text(values: dict[str, str]) -> str:
    """``lr=0.01 seed=2``: the job's swept values, short keys."""
    return " ".join(f"{k.split('.')[-1]}={v}" for k, v in values.items()) or "-"


class View:
    """Draws the running jobs on ``stream`` (a live table on a terminal, start/end lines otherwise)."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        self.stream = stream or sys.stdout
        self.live: Any = None
        self.records: dict[int, Records] = {}
        self.tty = wanted(self.stream)

    def say(self, text: str) -> None:
        """A line above the table."""
        if self.live is not None:
            from rich.text import Text

            for line in textfit.fit_lines(text, self.live.console.width):
                self.live.console.print(Text(line), soft_wrap=True)
        else:
            textfit.say(text, self.stream, flush=True)

    def started(self, child: Any) -> None:
        """A job started."""
        self.records[child.num] = Records(child.files["console"])
        self.say(f"ddp-run: sweep: job {child.num} ({values_text(child.values)}) started on {where(child)}")

    def ended(self, child: Any) -> None:
        """A job ended."""
        out = child.outcome or {}
        how = "refused" if out.get("refused") else (f"exit {out.get('code')}" if out.get("code") else "pruned"
                                                    if getattr(child, "pruned", None) else "completed")
        self.say(f"ddp-run: sweep: job {child.num} ({values_text(child.values)}) ended: {how} after "
                 f"{clock((child.ended or time.time()) - child.started)}"
                 + (f"; {out['run_dir']}" if out.get("run_dir") else f"; {out.get('reason') or ''}"))
        self.records.pop(child.num, None)

    def draw(self, running: Iterable[Any], done: int) -> None:
        """Redraw the table of running jobs (a terminal only)."""
        if not self.tty:
            return
        from rich.live import Live
        from rich.table import Table

        table = Table(title=f"sweep: {done} job{'s' if done != 1 else ''} ended", title_justify="left",
                      box=None, padding=(0, 1))
        for col in ("job", "values", "devices", "progress", "figures", "elapsed"):
            table.add_column(col)
        for child in sorted(running, key=lambda c: c.num):
            s = self.records[child.num].read() if child.num in self.records else {}
            progress = steps_text(s.get("step", 0), s.get("total")) or (s.get("stage") or "starting")
            if (phase := PHASES.get(s.get("phase") or "")):
                progress = f"{progress} {phase}"
            table.add_row(str(child.num), values_text(child.values), where(child), progress, figures(s),
                          clock(time.time() - child.started))
        if self.live is None:
            from rich.console import Console

            self.live = Live(table, console=Console(file=self.stream), refresh_per_second=4, transient=True)
            self.live.start()
        else:
            self.live.update(table)

    def close(self) -> None:
        """Give the terminal back."""
        if self.live is not None:
            self.live.stop()
            self.live = None
