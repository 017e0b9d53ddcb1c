"""Diagnostics end to end, through the real CLI (Hydra → torchrun → 2 gloo ranks on CPU): every rehearsal fault is
attributed to the right rank and class, a rank stopped from outside (SIGSTOP) is named as hung with its stack on
disk, debug mode names a collective mismatch and keeps its logs private, and no process is left behind.

Most launches are shared: the exception fault is the tiny GPT's failed run that test_compare_e2e.py also reports on
(tests/e2e/conftest.py: ``gpt_failed_run``); the OOM and the SIGKILLs are the failed runs that the recovery tests
continue or read (``smoke_oom_in_flight``, ``smoke_crashed``, ``gpt_zero1_crashed``); and a slow rank below the
watchdog is checked on the slow run that tests/e2e/test_terminal.py draws under a terminal."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from ddp_runner.contract import layout
from tests.support.driver import ddp_run
from tests.support.run_tree import load_json, run_dirs
from tests.support.shared_runs import shared_console

WATCHDOG_S = 5
# A collective timeout far above the watchdog's: a hang must be named by the watchdog, not by a timeout.
COMMON = ["device=cpu", "world_size=2", "train.max_steps=6", f"watchdog.timeout_s={WATCHDOG_S}", "timeout_s=90"]


# The run's own processes: torchrun's agent, the ranks' server and the ranks (not a report that reads the run: the
# shared failed run is also read by test_compare_e2e's ddp-compare, perhaps at the same time on another worker).
OWN = ("ddp_runner.launch.agent", "torch.distributed.run", "ddp_runner.tasks")


def _procs_of(run: Path) -> list[psutil.Process]:
    """Processes (torchrun, ranks) still working for ``run``."""
    found = []
    for p in psutil.process_iter(["cmdline", "environ"]):
        try:
            cmdline = p.info["cmdline"] or []
            if (any(str(run) in part for part in cmdline) and any(o in " ".join(cmdline) for o in OWN)) or \
                    str(run) in (p.info["environ"] or {}).get(layout.ENV_RUN_DIR, ""):
                found.append(p)
        except psutil.Error:
            continue
    return found


def _cause_lines(stderr: str) -> str:
    """The failure account's cause line and the line under it (``where:``): said once, first."""
    lines = stderr.strip().splitlines()
    [at] = [i for i, line in enumerate(lines) if "earliest error on" in line]
    assert lines[at].startswith("ddp-run: FAILED: "), lines[at]
    return "\n".join(lines[at:at + 2])


def _listed_as_failed(run: Path, root: Path, max_steps: int) -> None:
    """ddp-runs lists a real failed run as failed, at the step it reached, and ``show`` names its cause."""
    from ddp_runner.report import runs
    from ddp_runner.rundir import listing

    [row] = listing.scan(str(root)).rows
    assert (row.status, row.step, row.max_steps) == ("failed", 3, max_steps), row
    text = runs.describe(str(run))
    assert "root cause  earliest error on rank 1 [exception]: RuntimeError: injected fault on rank 1" in text
    assert f"continue    ddp-run resume={run}" in text


def test_a_hang_is_attributed_to_its_rank_and_class(tmp_path):
    t0 = time.monotonic()
    r = ddp_run([*COMMON, "fault.kind=hang", "fault.rank=1", "fault.step=3"], tmp_path, timeout=240)
    elapsed = time.monotonic() - t0
    [run] = run_dirs(tmp_path)
    _attributed(run, tmp_path, r.returncode, r.stderr, elapsed, "hang", 1, "hang", max_steps=6)


# The other rehearsal faults are read from failed runs the recovery tests make anyway (tests/e2e/conftest.py; each
# launched once per session): an OOM on rank 1 while rank 0's checkpoint write is in flight (test_resume.py), rank 1
# SIGKILLed (test_resume.py, test_resume_fallback_e2e.py), rank 0 SIGKILLed under zero1 (test_strategies.py): rank 0
# SIGKILLed leaves rank 1 waiting on it, which must not be named.
@pytest.mark.parametrize(("shared", "kind", "rank", "cls"), [
    ("smoke_oom_in_flight", "oom", 1, "oom"),
    ("smoke_crashed", "sigkill", 1, "signal"),
    ("gpt_zero1_crashed", "sigkill", 0, "signal"),
])
def test_fault_is_attributed_to_its_rank_and_class(request, shared, kind, rank, cls):
    run = request.getfixturevalue(shared)
    console = shared_console(run)
    _attributed(run, run.parents[1], console["rc"], console["stderr"], console["outside_s"], kind, rank, cls)


def test_an_exception_is_attributed_to_its_rank_and_class(gpt_failed_run):
    """The ``exception`` case of the test above, on the shared failed GPT run (rank 1 raises at step 3 of 12)."""
    run, console = gpt_failed_run, shared_console(gpt_failed_run)
    _attributed(run, run.parents[1], console["rc"], console["stderr"], console["outside_s"], "exception", 1,
                "exception", max_steps=12)


def _attributed(run: Path, root: Path, rc: int, stderr: str, elapsed: float, kind: str, rank: int, cls: str,
                max_steps: int | None = None) -> None:
    """The run (alone under ``root``) failed with ``kind`` injected on ``rank``, named as class ``cls``
    (``max_steps``: the run's, for the exception case's listing, at step 3)."""
    assert rc not in (0, layout.EXIT_REFUSED), stderr
    cause = load_json(run / layout.SUMMARY)["root_cause"]
    assert (cause["rank"], cause["class"]) == (rank, cls), cause
    assert f"earliest error on rank {rank} [{cls}]" in _cause_lines(stderr), stderr
    assert cause["where"] and all(c["rank"] != rank for c in cause["consequences"])
    if kind == "hang":
        hang = load_json(run / layout.HANG_RECORD)
        assert hang["rank"] == 1 and hang["step"] == 3 and "faults.py" in hang["top_frame"]
        since = load_json(run / layout.rank_progress(1))["since"]  # when rank 1 last made progress
        assert hang["time"] - since <= WATCHDOG_S + 15
        for r_ in (0, 1):
            assert "most recent call first" in (run / layout.rank_stack(r_)).read_text()
    if kind == "oom":
        assert "simulated on CPU" in cause["message"]
    if kind == "exception":  # the failing rank's own words, exit code and traceback
        assert "earliest error on rank 1 [exception]: RuntimeError: injected fault on rank 1 at step 3" in stderr
        manifest = load_json(run / layout.MANIFEST)
        assert manifest["status"] == "failed" and manifest["exit_codes"]["1"] == 1
        assert cause["type"] == "RuntimeError" and any("injected fault" in line for line in cause["traceback"])
        _listed_as_failed(run, root, max_steps)
    assert _procs_of(run) == []
    assert elapsed < 200  # generous: a loaded CI machine starts two ranks slowly


# A slow rank below the watchdog is not a hang (no hang record; the empty stack files are tidied away): the slow
# run of tests/e2e/test_terminal.py::test_a_bar_under_a_terminal_redrawn_every_second_while_a_step_takes_longer
# (rank 0 sleeps 2.5 s after steps 2 and 3, under an 8 s watchdog).


def test_a_long_validation_is_progress_not_a_hang(tmp_path):
    # 32 validation batches of 0.25 s per rank (8 s) against a 3 s watchdog: each batch counts as progress.
    here = Path(__file__).resolve().parents[1] / "support" / "user_tasks"
    r = subprocess.run([sys.executable, "-P", "-m", "ddp_runner", "device=cpu", "world_size=2", "train.max_steps=2",
                        "batch.per_rank=1", "task=smoke", "task.module=slow_validation", "watchdog.timeout_s=3",
                        "timeout_s=60",
                        f"output.root={tmp_path}"], cwd=here, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    [run] = run_dirs(tmp_path)
    assert not (run / layout.HANG_RECORD).exists()
    assert load_json(run / layout.SUMMARY)["val_loss"] is not None


def test_a_rank_stopped_from_outside_is_named_with_its_stack(tmp_path):
    driver = subprocess.Popen([sys.executable, "-m", "ddp_runner", "device=cpu", "world_size=2",
                               "train.max_steps=1000000",
                               "train.log_every=1000", f"watchdog.timeout_s={WATCHDOG_S}", "timeout_s=90",
                               f"output.root={tmp_path}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 180
        progress = None
        while time.monotonic() < deadline and driver.poll() is None:
            runs = run_dirs(tmp_path) if tmp_path.exists() else []
            with_progress = runs and (runs[0] / layout.rank_progress(1)).exists()
            if with_progress and (p := json.loads((runs[0] / layout.rank_progress(1)).read_text()))["step"] >= 2:
                progress = p
                break
            time.sleep(0.2)
        assert progress is not None, "rank 1 never made progress"
        [run] = run_dirs(tmp_path)
        stopped_at = time.time()
        os.kill(progress["pid"], signal.SIGSTOP)
        _, err = driver.communicate(timeout=120)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.communicate()
    assert driver.returncode not in (0, layout.EXIT_REFUSED), err
    hang = load_json(run / layout.HANG_RECORD)
    assert hang["rank"] == 1 and hang["stopped"] is True, hang
    assert hang["time"] - stopped_at <= WATCHDOG_S + 15
    assert hang["top_frame"], "the stopped rank's stack was written when it was resumed to end the run"
    assert "most recent call first" in (run / layout.rank_stack(1)).read_text()
    cause = load_json(run / layout.SUMMARY)["root_cause"]
    assert (cause["rank"], cause["class"]) == (1, "hang") and "stopped" in cause["message"]
    assert "earliest error on rank 1 [hang]" in _cause_lines(err), err
    assert _procs_of(run) == []


def test_debug_mode_names_a_collective_mismatch_and_keeps_its_logs_private(tmp_path):
    here = Path(__file__).resolve().parents[1] / "support" / "user_tasks"
    # -P as the ddp-run script: the working directory is not on the driver's sys.path, so the task module is
    # found there and handed to the workers as a user's would be.
    r = subprocess.run([sys.executable, "-P", "-m", "ddp_runner", "device=cpu", "world_size=2", "train.max_steps=2",
                        "task=smoke", "task.module=uneven_allreduce", "debug=true", "timeout_s=60",
                        f"output.root={tmp_path}"], cwd=here, capture_output=True, text=True, timeout=240)
    assert r.returncode not in (0, layout.EXIT_REFUSED), r.stdout + r.stderr
    [run] = run_dirs(tmp_path)
    cause = load_json(run / layout.SUMMARY)["root_cause"]
    assert cause["class"] == "exception" and "detected mismatch between collectives" in cause["message"].lower(), cause
    assert "detected mismatch between collectives" in _cause_lines(r.stderr).lower()
    debug = run / layout.DEBUG_LOGS
    assert stat.S_IMODE(debug.stat().st_mode) == 0o700
    logs = sorted(debug.iterdir())
    assert logs and all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in logs)
    text = (run / layout.rank_debug_log(0)).read_text()
    assert text.strip(), "torch's C++ / distributed debug output went to the private log"
    first = text.strip().splitlines()[0]
    assert first not in r.stdout + r.stderr, "and not to the console"
    assert _procs_of(run) == []
