"""A Slurm sweep's jobs followed together: every job is submitted first (``runner/launch/slurm.py``), then one
loop asks Slurm for all their states at once and shows them as one table (a terminal) or one line per change.

A job that ended is finished as a single followed job is (:func:`~ddp_runner.launch.slurm.await_final`: its own
driver's run.json, or the truth written for it when it never ran). Ctrl-C (or SIGTERM) cancels every job still
queued or running; each one's ranks stop and its run directory records it.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import IO, Any

from ddp_runner.console.live import clock, wanted
from ddp_runner.contract import layout
from ddp_runner.contract.osutil import handle_signals, restore_signals
from ddp_runner.launch.slurm import ENDED, POLL_S, await_final, job_state
from ddp_runner.rundir.run_dir import RunDir


@dataclass
class Entry:
    """One submitted job of the sweep."""

    num: int
    values: dict[str, str]
    rd: RunDir
    job_id: str
    submitted: float
    state: str = "PENDING"
    node: str = ""
    ended: float | None = None
    code: int | None = None


def parse_squeue(text: str) -> dict[str, tuple[str, str]]:
    """``squeue -o %i|%T|%N`` lines → {job id: (state, nodes)}."""
    out = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) >= 2 and parts[0]:
            out[parts[0]] = (parts[1], parts[2] if len(parts) > 2 else "")
    return out


def states(job_ids: Iterable[str]) -> dict[str, tuple[str, str]]:
    """Every job's Slurm state and nodes, in one ``squeue`` call (a job Slurm has forgotten is absent; when
    squeue cannot answer for the list, each job is asked on its own)."""
    ids = list(job_ids)
    if not ids:
        return {}
    r = subprocess.run(["squeue", "-h", "-t", "all", "-j", ",".join(ids), "-o", "%i|%T|%N"],
                       capture_output=True, text=True, timeout=60)
    if r.returncode == 0:
        return parse_squeue(r.stdout)
    found = {}
    for job_id in ids:
        info = job_state(job_id)
        if info:
            found[job_id] = (info.get("JobState", "UNKNOWN"), info.get("NodeList", ""))
    return found


class Follower:
    """The submitted jobs of one Slurm sweep, followed together; ``on_end(entry)`` as each one ends."""

    def __init__(self, on_end: Callable[[Entry], None], stream: IO[str] | None = None) -> None:
        self.on_end = on_end
        self.jobs: dict[int, Entry] = {}
        self.stream = stream or sys.stdout
        self.live: Any = None
        self.cancelled: int | None = None
        self._old: dict[int, Any] = {}

    def add(self, num: int, values: dict[str, str], rd: RunDir, job_id: str, submitted: float) -> None:
        """A job submitted (not yet followed)."""
        self.jobs[num] = Entry(num, values, rd, job_id, submitted)

    @property
    def pending(self) -> list[Entry]:
        """The jobs not seen ending yet."""
        return [e for e in self.jobs.values() if e.code is None]

    def poll(self) -> None:
        """Ask Slurm once for every pending job; finish the ones that ended."""
        pending = self.pending
        now = states(e.job_id for e in pending)
        for e in pending:
            state, node = now.get(e.job_id, ("", ""))
            if state and state != e.state:
                self._say(f"ddp-run: sweep: job {e.num} (Slurm job {e.job_id}) {state}"
                          + (f" on {node}" if state == "RUNNING" and node else ""))
            e.state, e.node = state or e.state, node or e.node
            if not state or state in ENDED:  # ended, or forgotten by Slurm
                e.ended = time.time()
                manifest = await_final(e.rd, state or "unknown")
                e.code = (0 if manifest.get("status") == layout.STATUS_COMPLETED
                          else 128 + self.cancelled if self.cancelled else 1)
                self.on_end(e)
        self._draw()

    def wait(self, num: int) -> Entry | None:
        """Follow every job until job ``num`` has ended."""
        self._handle_signals()
        while num in self.jobs and self.jobs[num].code is None:
            self.poll()
            if self.jobs[num].code is None:
                time.sleep(POLL_S)
        return self.jobs.get(num)

    def wait_all(self) -> None:
        """Follow every job to its end, then give the terminal and the signals back."""
        self._handle_signals()
        try:
            while self.pending:
                self.poll()
                if self.pending:
                    time.sleep(POLL_S)
        finally:
            if self.live is not None:
                self.live.stop()
                self.live = None
            restore_signals(self._old)
            self._old = {}

    def _handle_signals(self) -> None:
        if not self._old:
            self._old = handle_signals((signal.SIGINT, signal.SIGTERM), self._on_signal)

    def _on_signal(self, signum: int, _frame: Any) -> None:
        if self.cancelled is None:
            ids = [e.job_id for e in self.pending]
            self._say(f"ddp-run: sweep: cancelling {len(ids)} Slurm job(s) ({signal.Signals(signum).name}); their"
                      " ranks stop and each run directory records it")
            if ids:
                subprocess.run(["scancel", "--full", *ids], timeout=60, check=False)
        self.cancelled = self.cancelled or signum

    def _say(self, text: str) -> None:
        if self.live is not None:
            from rich.text import Text

            self.live.console.print(Text(text), soft_wrap=True)
        else:
            print(text, file=self.stream, flush=True)

    def _draw(self) -> None:
        if not wanted(self.stream):
            return
        from rich.console import Console
        from rich.live import Live
        from rich.table import Table

        done = sum(e.code is not None for e in self.jobs.values())
        table = Table(title=f"Slurm sweep: {done} of {len(self.jobs)} jobs ended", title_justify="left", box=None,
                      padding=(0, 1))
        for col in ("job", "values", "Slurm job", "state", "node", "since submitted"):
            table.add_column(col)
        for e in sorted(self.jobs.values(), key=lambda e: e.num):
            values = " ".join(f"{k.split('.')[-1]}={v}" for k, v in e.values.items()) or "-"
            table.add_row(str(e.num), values, e.job_id, e.state, e.node,
                          clock((e.ended or time.time()) - e.submitted))
        if self.live is None:
            self.live = Live(table, console=Console(file=self.stream), refresh_per_second=2, transient=False)
            self.live.start()
        else:
            self.live.update(table)
