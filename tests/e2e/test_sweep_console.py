"""A sweep whose jobs run in turn says one line per finished job on its console (issue 51, item 9): each job's plan,
run directory and step lines stay in its run directory (run.json, logs/console.jsonl), its closing line names the
directory, and the sweep's table closes the console. Read from the shared sweep of tests/e2e/conftest.py (no launch
of its own)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.support.run_tree import run_dirs
from tests.support.shared_runs import shared_console


def test_a_sweep_run_in_turn_says_one_line_per_finished_job(smoke_lr_sweep: Path) -> None:
    console = shared_console(smoke_lr_sweep)
    out = console["stdout"].splitlines()
    runs = run_dirs(smoke_lr_sweep.parent.parent)  # the two jobs that ran (the other two were refused)
    assert len(runs) == 2
    until_table = out[:next(i for i, line in enumerate(out) if line.startswith("ddp-run: sweep: "))]
    assert until_table[0] == f"ddp-run: sweep directory {smoke_lr_sweep}", out
    summaries = [json.loads((run / "summary.json").read_text()) for run in runs]
    assert [re.sub(r", [\d.]+ s wall-clock", "", line) for line in until_table[1:]] == [
        f"ddp-run: job {n} completed: {s['steps']} steps, final loss {s['losses'][-1]:.4f}; {run}"
        for n, (run, s) in enumerate(zip(runs, summaries, strict=True))], out
    for run in runs:  # what the console no longer shows is in the run directory
        records = [json.loads(line) for line in (run / "logs" / "console.jsonl").read_text().splitlines()]
        assert any(r["kind"] == "step" for r in records), records
