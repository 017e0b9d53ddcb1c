"""What a run's status really is: ``run.json`` says ``running`` until its driver rewrites it, and a driver killed
with SIGKILL (or whose machine died) never does. Every reader of the run tree asks :func:`effective_status`.

The driver records itself in ``run.json`` as ``driver: {host, pid, started, heartbeat}`` (``started``: the
process's start time, so that a reused pid is not taken for it; ``heartbeat``: Unix seconds, refreshed while it
supervises). A ``running`` run reads as ``lost`` when

- its driver ran on this host and that process is gone (no such pid, or a pid with another start time), or
- its driver ran elsewhere (or cannot be checked) and its heartbeat is older than ``STALE_AFTER_S``.

Standard library plus psutil (already a driver dependency); nothing heavy at import.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Mapping
from typing import Any

from ddp_runner.contract import layout

# The driver refreshes its heartbeat every HEARTBEAT_S; a reader on another host calls the driver gone after
# STALE_AFTER_S without one (several missed beats: a slow remote store or a busy machine is not a death).
HEARTBEAT_S = 10.0
STALE_AFTER_S = 60.0
# Process start times are derived from boot time and clock ticks: equal for one process, however often read.
_START_TOLERANCE_S = 0.05

# (driver record) -> True alive, False gone, None cannot tell from here (another host).
Liveness = Callable[[Mapping[str, Any]], "bool | None"]


def heartbeat_every_s() -> float:
    """How often the driver refreshes its heartbeat (``DDP_RUNNER_HEARTBEAT_S`` overrides it, for tests)."""
    value = os.environ.get(layout.ENV_HEARTBEAT_S)
    return float(value) if value else HEARTBEAT_S


def this_driver(now: float | None = None) -> dict[str, Any]:
    """The calling process's driver record: host, pid, process start time and a fresh heartbeat."""
    import psutil

    return {"host": socket.gethostname(), "pid": os.getpid(), "started": psutil.Process().create_time(),
            "heartbeat": time.time() if now is None else now}


def local_pid_alive(driver: Mapping[str, Any]) -> bool | None:
    """Is the driver recorded in ``driver`` alive? None when it ran on another host (only its heartbeat tells)."""
    import psutil

    if driver.get("host") != socket.gethostname() or not isinstance(driver.get("pid"), int):
        return None
    try:
        proc = psutil.Process(driver["pid"])
        started = proc.create_time()
        if proc.status() == psutil.STATUS_ZOMBIE:  # dead, only not yet reaped by its parent
            return False
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:  # exists but cannot be inspected: trust the pid
        return True
    recorded = driver.get("started")
    return not isinstance(recorded, (int, float)) or abs(started - recorded) < _START_TOLERANCE_S


def effective_status(manifest: Mapping[str, Any], now: float, this_host_pid_alive: Liveness | None = None,
                     stale_after_s: float = STALE_AFTER_S) -> str:
    """The status a reader should believe: ``manifest["status"]``, except that a ``running`` run whose driver is
    gone reads as ``lost`` (``layout.STATUS_LOST``).

    Pure: ``now`` is Unix seconds and ``this_host_pid_alive`` answers for a driver on the reader's host (see
    :func:`local_pid_alive`); without it, or when it answers None, the heartbeat decides. A ``running`` run with no
    driver record has nothing vouching for it and reads as ``lost``.
    """
    status = manifest.get("status")
    if status != layout.STATUS_RUNNING:
        return str(status) if status is not None else layout.STATUS_LOST
    driver = manifest.get("driver")
    if not isinstance(driver, Mapping):
        return layout.STATUS_LOST
    alive = this_host_pid_alive(driver) if this_host_pid_alive is not None else None
    if alive is not None:
        return layout.STATUS_RUNNING if alive else layout.STATUS_LOST
    beat = driver.get("heartbeat")
    if not isinstance(beat, (int, float)) or now - beat > stale_after_s:
        return layout.STATUS_LOST
    return layout.STATUS_RUNNING


def status_of(manifest: Mapping[str, Any], now: float | None = None) -> str:
    """:func:`effective_status` as seen from this process, now (the convenience for readers of the tree)."""
    return effective_status(manifest, time.time() if now is None else now, local_pid_alive)


def describe_driver(manifest: Mapping[str, Any], now: float | None = None) -> str:
    """``pid 123 on host h (heartbeat 4 s ago)``: who is running a run, for messages."""
    d = manifest.get("driver") or {}
    beat = d.get("heartbeat")
    age = (f" (heartbeat {max(0.0, (time.time() if now is None else now) - beat):.0f} s ago)"
           if isinstance(beat, (int, float)) else "")
    return f"pid {d.get('pid')} on host {d.get('host')}{age}"
