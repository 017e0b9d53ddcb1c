"""The hang watchdog names a stopped rank (SIGSTOP: state ``T``) ahead of the healthy ranks
that wait for it in a collective, also when the stopped rank's last progress record reads further along (a higher
step, or a later phase of the same step) than theirs: a record is written at most once a second, and a stopped
process writes none, so its record can be ahead of the moment it stopped while the others wait for it.

Real processes stand in for the ranks (psutil sees one stopped); their progress records and stacks are written
by the test as the ranks' heartbeat and faulthandler would write them. No torchrun."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from ddp_runner.contract import layout
from ddp_runner.diagnostics import rootcause
from ddp_runner.diagnostics.watchdog import Watchdog
from tests.support.waiting import wait_for

TIMEOUT_S = 0.3
# A rank: ignores the watchdog's SIGUSR1 (its stack is written by the test), ends on SIGTERM.
_RANK = ("import signal, time; signal.signal(signal.SIGUSR1, signal.SIG_IGN); print('ready', flush=True);"
         " time.sleep(120)")
_WAITING_STACK = """Thread 0x00007f0000000001 (most recent call first):
  File "/venv/lib/python3.12/site-packages/torch/distributed/distributed_c10d.py", line 2810 in all_reduce
  File "/work/tasks/engine/strategy/grad_sync.py", line 88 in sync
  File "/work/tasks/engine/trainer.py", line 420 in step
"""
_STOPPED_STACK = """Thread 0x00007f0000000001 (most recent call first):
  File "/work/tasks/engine/trainer.py", line 380 in step
"""


@pytest.fixture
def ranks() -> Iterator[list[subprocess.Popen[str]]]:
    """Three rank processes, each ready (its SIGUSR1 disposition set)."""
    procs = [subprocess.Popen([sys.executable, "-c", _RANK], stdout=subprocess.PIPE, text=True) for _ in range(3)]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        yield procs
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=10)
            if p.stdout is not None:
                p.stdout.close()


@pytest.mark.parametrize(("stopped", "stopped_at", "waiting_at"), [
    pytest.param(1, {"step": 6, "phase": "data"}, {"step": 5, "phase": "sync"}, id="higher-step"),
    pytest.param(2, {"step": 5, "phase": "optimizer"}, {"step": 5, "phase": "sync"}, id="later-phase"),
])
def test_a_stopped_rank_is_named_before_the_ranks_waiting_for_it(
        tmp_path: Path, ranks: list[subprocess.Popen[str]], stopped: int, stopped_at: dict[str, Any],
        waiting_at: dict[str, Any]) -> None:
    """The stopped rank is the hang's rank (and the root cause), although its record reads further along than the
    healthy ranks' that wait in a collective."""
    (tmp_path / layout.PROGRESS).mkdir(parents=True)
    (tmp_path / layout.STACKS).mkdir(parents=True)
    now = time.time()
    for r, proc in enumerate(ranks):
        at = stopped_at if r == stopped else waiting_at
        since = now - 1.0 if r == stopped else now - 2.0  # the waiting ranks' phase began first, too
        record = {"rank": r, "pid": proc.pid, "start_step": 0, "seq": 10 + r, "since": since, **at}
        (tmp_path / layout.rank_progress(r)).write_text(json.dumps(record))
        (tmp_path / layout.rank_stack(r)).write_text(_STOPPED_STACK if r == stopped else _WAITING_STACK)
    os.kill(ranks[stopped].pid, signal.SIGSTOP)
    wait_for("the rank to be stopped", lambda: psutil.Process(ranks[stopped].pid).status() == psutil.STATUS_STOPPED,
             timeout=10)

    said: list[str] = []
    watch = Watchdog(str(tmp_path), str(tmp_path), 3, TIMEOUT_S, lambda: None, say=said.append)
    watch.tick()
    assert watch.hang is None
    # Not a wait for another process: the watchdog's own clock must pass its timeout since it saw the records
    # (the first tick). A lower bound: load can only lengthen it, and the verdict does not depend on by how much.
    time.sleep(TIMEOUT_S + 0.1)
    watch.tick()

    hang = watch.hang
    assert hang is not None, said
    assert (hang["rank"], hang["stopped"]) == (stopped, True), hang
    assert (hang["step"], hang["phase"]) == (stopped_at["step"], stopped_at["phase"])
    assert hang["top_frame"] == "/work/tasks/engine/trainer.py:380 in step"
    assert json.loads((tmp_path / layout.HANG_RECORD).read_text())["rank"] == stopped
    assert said[-1].startswith(f"ddp-run: HANG: rank {stopped} made no progress") and "stopped by SIGSTOP" in said[-1]
    cause = rootcause.root_cause({"world_size": 3, "rc": 1, "watch": watch.observations(), "exit_codes": {}})
    assert cause is not None and (cause["rank"], cause["class"]) == (stopped, "hang")
    # The watchdog resumed the stopped rank with a SIGTERM pending, so that it ends.
    assert ranks[stopped].wait(timeout=10) == -signal.SIGTERM
