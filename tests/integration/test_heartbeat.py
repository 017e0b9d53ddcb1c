"""Diagnostics in-process: the checks of watchdog.* / fault.* / debug, the root-cause classification, the stack
parsing, the progress heartbeat and the injected faults (the end-to-end runs: test_diagnostics_e2e.py)."""

from __future__ import annotations

import stat
import subprocess
import sys
import textwrap
from pathlib import Path

from ddp_runner.contract import layout
from ddp_runner.diagnostics.watchdog import read_progress, top_frame

ROOT = Path(__file__).resolve().parents[2]

# ------------------------------------------------------------------------------------------------ worker side

def test_heartbeat_writes_progress_and_stacks_on_sigusr1(tmp_path):
    """In a child process: the progress file follows the loop's marks, and SIGUSR1 writes every thread's stack."""
    for rel in (layout.PROGRESS, layout.STACKS):
        (tmp_path / rel).mkdir(parents=True)
    script = textwrap.dedent(f"""\
        import os, signal, time
        from ddp_runner.tasks.engine.diagnostics import heartbeat
        heartbeat.start({str(tmp_path)!r}, 1, 4, enabled=True)
        heartbeat.phase("forward_backward")
        heartbeat.step(5)
        heartbeat.phase("checkpoint")
        heartbeat.flush()
        os.kill(os.getpid(), signal.SIGUSR1)
        heartbeat.stop()
        """)
    subprocess.run([sys.executable, "-c", script], cwd=ROOT, check=True, timeout=60)
    progress = read_progress(str(tmp_path), 2)
    assert list(progress) == [1]
    p = progress[1]
    assert (p["rank"], p["start_step"], p["step"], p["phase"]) == (1, 4, 5, "checkpoint")
    stack = (tmp_path / layout.rank_stack(1)).read_text()
    assert top_frame(stack, p["main_thread"]).endswith("in <module>")


def test_heartbeat_off_writes_nothing(tmp_path):
    (tmp_path / layout.STACKS).mkdir(parents=True)
    script = ("from ddp_runner.tasks.engine.diagnostics import heartbeat\n"
              f"heartbeat.start({str(tmp_path)!r}, 0, 0, enabled=False)\nheartbeat.step(1)\nheartbeat.flush()\n")
    subprocess.run([sys.executable, "-c", script], cwd=ROOT, check=True, timeout=60)
    assert read_progress(str(tmp_path), 1) == {}


def test_debug_logs_are_owner_only_whatever_the_umask(tmp_path):
    (tmp_path / layout.LOGS).mkdir()
    script = textwrap.dedent(f"""\
        import os, sys
        os.umask(0)
        from ddp_runner.tasks.engine.diagnostics import debug
        debug.apply({str(tmp_path)!r}, 3)
        os.write(2, b"c-level line\\n")
        print("python line", file=sys.stderr, flush=True)
        print(os.environ["NCCL_DEBUG_FILE"], flush=True)
        """)
    r = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    folder = tmp_path / layout.DEBUG_LOGS
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    log, nccl = tmp_path / layout.rank_debug_log(3), tmp_path / layout.rank_debug_log(3, "nccl")
    assert r.stdout.strip() == str(nccl)
    for f in (log, nccl):
        assert stat.S_IMODE(f.stat().st_mode) == 0o600
    assert log.read_text() == "c-level line\n" and r.stderr == "python line\n"
