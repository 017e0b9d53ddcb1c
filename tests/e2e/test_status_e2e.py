"""Status that stays true: the driver's record and heartbeat in run.json, ``lost`` for a run whose driver is gone,
``interrupted`` for Ctrl-C / SIGTERM, one driver per run directory, and a failure while finalising (a real full
disk, a real unwritable path) that ends with one line, a non-zero exit and no temporary files.

The end-to-end tests run the real CLI with one gloo rank held by the ``hang`` fault, so that the driver is
certainly mid-run when the test acts; every wait polls a condition with a generous deadline.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
import pytest

from ddp_runner.contract import layout
from ddp_runner.rundir.status import status_of
from tests.support.driver import cli_in_process, ddp_run
from tests.support.run_tree import load_json, run_dirs
from tests.support.waiting import wait_for

# ------------------------------------------------------------------------------------------------ end to end

# One rank, one checkpoint per step, 4 steps; the hang fault holds the rank after step 2, before its checkpoint
# (a continued run does not repeat a rehearsal fault).
SMOKE = ["task=smoke", "device=cpu", "world_size=1", "checkpoint.every_steps=1", "train.max_steps=4"]
HANG = ["fault.kind=hang", "fault.rank=0", "fault.step=2"]


_started: list[subprocess.Popen[str]] = []


def start_driver(args: list[str], root: Path, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    _started.append(subprocess.Popen([sys.executable, "-m", "ddp_runner", *args, f"output.root={root}"],
                            cwd=tempfile.gettempdir(), env={**os.environ, **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return _started[-1]


def the_run(root: Path) -> Path | None:
    runs = run_dirs(root) if root.exists() else []
    return runs[0] if runs and (runs[0] / layout.MANIFEST).exists() else None


def workers_gone(run: Path) -> bool:
    for p in psutil.process_iter(["environ"]):
        try:
            if str(run) in (p.info["environ"] or {}).get(layout.ENV_RUN_DIR, ""):
                return False
        except psutil.Error:
            continue
    return True


def no_temporaries(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if ".tmp" in p.name]


def test_sigkilled_driver_reads_as_lost_and_its_run_resumes(tmp_path):
    root = tmp_path / "out"
    driver = start_driver([*SMOKE, *HANG], root)
    run = wait_for("the run directory", lambda: the_run(root), driver=driver)
    wait_for("step_1", lambda: (run / "checkpoints/step_1/meta.json").exists(), driver=driver)
    driver.kill()
    driver.wait()
    wait_for("the workers to stop (torchrun dies with the driver)", lambda: workers_gone(run))
    recorded = load_json(run / layout.MANIFEST)
    assert recorded["status"] == "running" and recorded["driver"]["pid"] == driver.pid
    assert status_of(recorded) == "lost"
    # ddp-runs says so, and gives the command that continues it: the one run next
    from ddp_runner.report import runs
    from ddp_runner.rundir import listing

    assert [row.status for row in listing.scan(str(root)).rows] == ["lost"]
    shown = runs.describe(str(run))
    assert "lost: run.json says running, but its driver is gone" in shown
    assert f"continue    ddp-run resume={run}    # in place, from step_" in shown

    r = ddp_run([f"resume={run}"], root)
    assert r.returncode == 0, r.stdout + r.stderr
    final, summary = load_json(run / layout.MANIFEST), load_json(run / layout.SUMMARY)
    assert final["status"] == "completed" and summary["steps"] == 4
    assert summary["resumed_from"].endswith("checkpoints/step_1")
    assert final["driver"]["pid"] != driver.pid, "the new driver recorded itself"


def test_second_driver_is_refused_heartbeat_refreshes_and_sigint_reads_interrupted(tmp_path, monkeypatch):
    root = tmp_path / "out"
    driver = start_driver([*SMOKE, *HANG], root, env={layout.ENV_HEARTBEAT_S: "0.5"})
    run = wait_for("the run directory", lambda: the_run(root), driver=driver)
    first = load_json(run / layout.MANIFEST)["driver"]
    assert first["pid"] == driver.pid and first["host"] == socket.gethostname()
    wait_for("a refreshed heartbeat",
             lambda: load_json(run / layout.MANIFEST)["driver"]["heartbeat"] > first["heartbeat"], driver=driver)

    # The second driver is refused before it launches anything: the CLI's main() in this process (a second
    # interpreter would cost its start-up for the same refusal).
    r = cli_in_process([f"resume={run}"], root, monkeypatch)
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"pid {driver.pid} on host {socket.gethostname()}" in r.stderr, r.stderr
    assert "one driver per run directory" in r.stderr
    assert load_json(run / layout.MANIFEST)["driver"]["pid"] == driver.pid, "the refused driver wrote nothing"

    wait_for("the rank to start", lambda: (run / "logs/rank0.json").exists(), driver=driver)
    driver.send_signal(signal.SIGINT)
    _, err = driver.communicate(timeout=90)
    assert driver.returncode == 128 + signal.SIGINT, err
    assert "INTERRUPTED" in err
    manifest_, summary = load_json(run / layout.MANIFEST), load_json(run / layout.SUMMARY)
    assert manifest_["status"] == summary["status"] == "interrupted"
    assert status_of(manifest_) == "interrupted"
    from ddp_runner.rundir import listing

    assert [row.status for row in listing.scan(str(root)).rows] == ["interrupted"]  # as ddp-runs lists it


def test_unwritable_summary_is_recorded_in_run_json(tmp_path):
    # A directory where summary.json must go: a real OSError (IsADirectoryError) at the rename, root or not.
    root = tmp_path / "out"
    driver = start_driver([*SMOKE, "train.max_steps=2", "checkpoint.every_steps=0"], root)
    run = wait_for("the run directory", lambda: the_run(root), driver=driver)
    (run / layout.SUMMARY).mkdir()
    out, err = driver.communicate(timeout=120)
    assert driver.returncode == 1, out + err
    lines = [line for line in err.splitlines() if "while finalising" in line]
    assert len(lines) == 1 and "(writing summary.json)" in lines[0] and "run.json records it" in lines[0], err
    assert "Traceback" not in err
    recorded = load_json(run / layout.MANIFEST)
    assert recorded["status"] == "failed" and recorded["finalize_error"]["while"] == "writing summary.json"
    assert "IsADirectoryError" in recorded["finalize_error"]["error"]
    assert no_temporaries(root) == []


@pytest.fixture
def small_disk(tmp_path):
    """A 32 MiB tmpfs (needs root, as CI has): a disk that can really fill up."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        if subprocess.run(["umount", str(mnt)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def fill(disk: Path) -> None:
    chunk = b"\0" * (1 << 20)
    with open(disk / "filler", "wb", buffering=0) as f:
        try:
            while True:
                f.write(chunk)
        except OSError:
            pass
    with open(disk / "filler", "ab", buffering=0) as f:  # the last pages, byte by byte
        try:
            while True:
                f.write(b"\0" * 512)
        except OSError:
            pass


def test_full_disk_before_finalising_still_records_the_end_and_the_way_on(small_disk):
    """A disk that fills while the run is stopped: the space the driver held back at launch (runner/rundir/
    reserve.py) takes the final run.json, which is whole and never left ``running`` (issue 51 item 8), and the
    console names the last complete checkpoint and how to continue."""
    root = small_disk / "out"
    driver = start_driver([*SMOKE, *HANG], root)
    run = wait_for("the run directory", lambda: the_run(root), driver=driver)
    wait_for("step_1", lambda: (run / "checkpoints/step_1/meta.json").exists(), driver=driver)
    fill(small_disk)
    driver.send_signal(signal.SIGTERM)
    out, err = driver.communicate(timeout=90)
    assert driver.returncode == 128 + signal.SIGTERM, out + err
    assert "while finalising" not in err, err
    assert "Traceback" not in err
    assert no_temporaries(root) == [], "no temporary file left behind"
    recorded = json.loads((run / layout.MANIFEST).read_text())  # whole, never half of one
    assert recorded["status"] == layout.STATUS_INTERRUPTED and status_of(recorded) == layout.STATUS_INTERRUPTED
    assert "the last complete checkpoint is step_" in err and f"ddp-run resume={run}" in err, err
