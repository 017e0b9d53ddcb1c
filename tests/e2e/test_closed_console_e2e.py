"""End-to-end: ``ddp-run … | head -3``. The console's reader goes away mid-run and the run loses nothing: it ends
``completed`` with every step and its last checkpoint, rank 0's console lines go on in ``logs/rank0.log``, and the
driver exits 0 without a traceback (docs/run-tree.md, "The console is never the run's weak point")."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from ddp_runner.contract import layout
from tests.support.recipes import rank0_sleeps
from tests.support.run_tree import load_json, run_dirs

STEPS = 8


def test_a_console_closed_mid_run_costs_no_step(out_root: Path, tmp_path: Path) -> None:
    """Two gloo ranks of the smoke task, a step line each step, rank 0 slowed after step 1 so that the reader has
    gone long before the end: the driver's stdout is a pipe closed after three lines (its plan, its run directory,
    step 1), its stderr a file."""
    err_path = tmp_path / "stderr.txt"
    args = ["task=smoke", "device=cpu", "world_size=2", f"train.max_steps={STEPS}", "checkpoint.every_steps=4",
            *rank0_sleeps(0.4), f"output.root={out_root}"]
    with open(err_path, "wb") as err:
        driver = subprocess.Popen([sys.executable, "-m", "ddp_runner", *args], stdout=subprocess.PIPE, stderr=err,
                                  cwd=tempfile.gettempdir())
        assert driver.stdout is not None
        seen = [driver.stdout.readline() for _ in range(3)]
        driver.stdout.close()  # head -3 has what it wanted
        rc = driver.wait(timeout=240)
    said = err_path.read_text()
    assert rc == 0, said
    for word in ("Traceback", "BrokenPipeError", "Exception ignored"):
        assert word not in said, said
    [run] = run_dirs(out_root)
    assert load_json(run / layout.MANIFEST)["status"] == layout.STATUS_COMPLETED
    summary = load_json(run / layout.SUMMARY)
    assert summary["status"] == layout.STATUS_COMPLETED and summary["steps"] == STEPS, summary.get("root_cause")
    assert (run / layout.CHECKPOINTS / f"step_{STEPS}").is_dir()
    assert b"step" in seen[-1], seen  # the reader went away while rank 0 trained
    rank0 = (run / "logs" / "rank0.log").read_text()
    assert "console: the user's console cannot be written" in rank0
    assert f"step {STEPS}/{STEPS}" in rank0.split("console: the user's console")[1]
