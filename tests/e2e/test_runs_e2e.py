"""``ddp-runs`` as a user runs it, over real run directories: the session's smoke reference run copied four times
into one output root and made completed, failed, interrupted and lost by editing its run.json and summary.json
(the real interrupted, lost and failed runs are listed in test_status_e2e.py and test_diagnostics_e2e.py). Piped,
the table is plain text; under a terminal (a pty), a rich table."""

from __future__ import annotations

import json
import os
import pty
import shutil
import subprocess
import sys
import tempfile
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from ddp_runner.contract import layout
from tests.support.run_tree import load_json

ROOT = Path(__file__).resolve().parents[2]


def _variant(reference: Path, root: Path, name: str, status: str, minutes_ago: int) -> Path:
    run = root / "2026-12-01" / name
    shutil.copytree(reference, run)
    manifest, summary = load_json(run / layout.MANIFEST), load_json(run / layout.SUMMARY)
    manifest["status"] = status
    manifest["started"] = (datetime.now() - timedelta(minutes=minutes_ago)).isoformat(timespec="seconds")
    if status == layout.STATUS_RUNNING:  # a driver that is gone: a process of this host that has exited
        gone = subprocess.Popen(["true"])
        gone.wait()
        manifest["driver"] = {**manifest["driver"], "pid": gone.pid, "started": manifest["driver"]["started"] - 1}
        (run / layout.SUMMARY).unlink()
    elif status != layout.STATUS_COMPLETED:  # as finalize leaves a run that did not complete: no training figures
        cause = {"rank": 1, "class": "exception", "type": "RuntimeError", "message": "boom", "where": "x.py:3",
                 "traceback": [], "consequences": [], "other_failed_ranks": []}
        summary = {"status": status, "global_batch": summary["global_batch"], "root_cause": cause, "losses": None}
        (run / layout.SUMMARY).write_text(json.dumps(summary))
    (run / layout.MANIFEST).write_text(json.dumps(manifest))
    return run


@pytest.fixture
def root(smoke_reference: Path, tmp_path: Path) -> Path:
    out = tmp_path / "outputs"
    for name, status, ago in (("a_completed", "completed", 40), ("b_failed", "failed", 30),
                              ("c_interrupted", "interrupted", 20), ("d_lost", "running", 10)):
        _variant(smoke_reference, out, name, status, ago)
    return out


def _ddp_runs(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ddp_runner.report.runs", *args], cwd=tempfile.gettempdir(),
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=120)


def test_the_listing_of_completed_failed_interrupted_and_lost_runs(root: Path, smoke_reference: Path) -> None:
    r = _ddp_runs(str(root))
    assert r.returncode == 0 and r.stderr == "", r.stderr
    lines = r.stdout.splitlines()
    assert "\x1b[" not in r.stdout and lines[0].startswith("RUN ")  # piped: plain text
    rows = [line.split() for line in lines[1:]]
    assert [(row[0].rsplit("/", 1)[-1], row[1]) for row in rows] == [
        ("d_lost", "lost"), ("c_interrupted", "interrupted"), ("b_failed", "failed"), ("a_completed", "completed")]
    summary = load_json(smoke_reference / layout.SUMMARY)
    last = f"{summary['losses'][-1]:.4f}"
    for row in rows:
        # task, world, global batch, step reached/max (smoke trains by epochs: the total is known once it completed)
        assert row[2:6] == ["smoke", "2", "16", "8/8" if row[1] == "completed" else "8/?"], row
        # the completed run's loss is summary.json's; the others' are read back from TensorBoard
        assert row[6] == last and row[8] == "samples/s", row
    assert rows[-1][9:] == ["40", "min"]

    data = json.loads(_ddp_runs(str(root), "--json").stdout)
    assert [r["status"] for r in data["runs"]] == ["lost", "interrupted", "failed", "completed"]


def test_show_names_the_cause_and_the_command_that_continues_it(root: Path) -> None:
    failed = root / "2026-12-01" / "b_failed"
    r = _ddp_runs("show", str(failed))
    assert r.returncode == 0, r.stderr
    assert "root cause  earliest error on rank 1 [exception]: RuntimeError: boom (where: x.py:3)" in r.stdout
    assert f"continue    ddp-run resume={failed}    # in place, from step_8" in r.stdout
    assert "reproduce   cd " in r.stdout and "ddp-run task=smoke device=cpu world_size=2" in r.stdout
    assert "global batch 16 = 8 per rank × 2 ranks × 1 accumulation" in r.stdout


def test_a_terminal_gets_a_rich_table(root: Path) -> None:
    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "ddp_runner.report.runs", str(root)], cwd=tempfile.gettempdir(),
                            env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "160"}, stdout=follower,
                            stderr=follower, stdin=follower)
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the pty closes when the command ends
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    assert proc.wait(timeout=60) == 0
    text = b"".join(chunks).decode(errors="replace")
    assert "\x1b[" in text and "━" in text, text  # a rich table: colours and rules
    for name in ("a_completed", "b_failed", "c_interrupted", "d_lost"):
        assert name in text
