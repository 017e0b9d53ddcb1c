"""Status that stays true: the driver's record and heartbeat in run.json, ``lost`` for a run whose driver is gone,
``interrupted`` for Ctrl-C / SIGTERM, one driver per run directory, and a failure while finalising (a real full
disk, a real unwritable path) that ends with one line, a non-zero exit and no temporary files.

The end-to-end tests run the real CLI with one gloo rank held by the ``hang`` fault, so that the driver is
certainly mid-run when the test acts; every wait polls a condition with a generous deadline.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import psutil

from ddp_runner.rundir.status import local_pid_alive, status_of, this_driver


def test_local_liveness_knows_this_process_a_dead_one_and_a_reused_pid():
    me = this_driver()
    assert me["host"] == socket.gethostname() and me["pid"] == os.getpid()
    assert local_pid_alive(me) is True
    assert local_pid_alive({**me, "started": me["started"] - 100}) is False, "same pid, another process"
    assert local_pid_alive({**me, "host": me["host"] + "-elsewhere"}) is None
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    started = psutil.Process(child.pid).create_time()
    deadline = time.monotonic() + 30
    while psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
        time.sleep(0.05)
    assert local_pid_alive({**me, "pid": child.pid, "started": started}) is False, "a zombie is dead"
    child.wait()
    assert local_pid_alive({**me, "pid": child.pid, "started": started}) is False
    assert status_of({"status": "running", "driver": me}) == "running"
