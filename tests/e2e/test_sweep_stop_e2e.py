"""Ctrl-C during a sequential sweep (issue 51, item 3), end to end on the CPU: the running job saves its checkpoint and
ends interrupted, no further job starts, the rest are recorded ``not run``, and the sweep exits 128 + SIGINT saying
how to go on. (What the sweep does around its jobs, SIGTERM and a stop between jobs: tests/integration/
test_sweep_stop.py.)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.support.recipes import rank0_sleeps
from tests.support.run_tree import load_json, run_dirs
from tests.support.waiting import wait_for


@pytest.mark.parametrize("presses", [1, 2])
def test_ctrl_c_in_a_sequential_sweep_stops_the_sweep(presses: int, tmp_path: Path) -> None:
    """Once: job 0 saves its checkpoint. Twice: job 0 stops at once, without it; the sweep ends the same way."""
    root = tmp_path / "outputs"
    # Job 0 trains until the signal (a rehearsal `slow` fault keeps it from spinning through its steps).
    driver = subprocess.Popen([sys.executable, "-m", "ddp_runner", "-m", "task=smoke", "device=cpu", "world_size=1",
                               "train.max_steps=100000", "train.log_every=1000", "seed=1,2,3", *rank0_sleeps(0.1),
                               f"output.root={root}"], cwd=tempfile.gettempdir(), env=dict(os.environ),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        def training() -> list[Path]:
            found = list(root.glob("*/*_sweep/0_smoke_*/logs/progress/rank0.json"))
            return found if found and load_json(found[0]).get("step", 0) >= 1 else []

        wait_for("job 0 to train", training, timeout=240, driver=driver)
        driver.send_signal(signal.SIGINT)
        if presses == 2:
            time.sleep(0.2)  # the driver takes the first (a rank may even have saved by now: either way it stops)
            driver.send_signal(signal.SIGINT)
        out, err = driver.communicate(timeout=120)
    finally:
        if driver.poll() is None:
            driver.kill()
    assert driver.returncode == 128 + signal.SIGINT, out + err
    assert "Traceback" not in err, err
    [sweep] = list(root.glob("*/*_sweep"))
    jobs = load_json(sweep / "sweep.json")["jobs"]
    assert [j["status"] for j in jobs] == ["interrupted", "not run", "not run"], jobs
    [run] = run_dirs(root)
    assert Path(jobs[0]["run_dir"]) == run and load_json(run / "run.json")["status"] == "interrupted"
    if presses == 1:
        stopped = load_json(run / "logs/rank0.json")["stopped"]
        assert (run / "checkpoints" / f"step_{stopped['step']}").is_dir(), stopped
    assert "ddp-run: sweep: stopped by SIGINT: no further job was started; job 0 ended interrupted" in err, err
    assert "not run: job 1, 2" in err and "  ddp-run task=smoke device=cpu world_size=1" in err, err
    assert (sweep / "sweep.md").read_text().count("| not run |") == 2
