"""Status that stays true: the driver's record and heartbeat in run.json, ``lost`` for a run whose driver is gone,
``interrupted`` for Ctrl-C / SIGTERM, one driver per run directory, and a failure while finalising (a real full
disk, a real unwritable path) that ends with one line, a non-zero exit and no temporary files.

The end-to-end tests run the real CLI with one gloo rank held by the ``hang`` fault, so that the driver is
certainly mid-run when the test acts; every wait polls a condition with a generous deadline.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from ddp_runner.rundir.status import effective_status

NOW = 1_000_000.0


def manifest(status: str = "running", **driver) -> dict:
    return {"status": status, "driver": {"host": "h", "pid": 7, "started": 5.0, "heartbeat": NOW - 5, **driver}}


# ----------------------------------------------------------------------------------------- the pure function


@pytest.mark.parametrize("final", ["completed", "failed", "interrupted"])
def test_a_final_status_is_what_it_says_whatever_the_driver(final):
    assert effective_status(manifest(final, heartbeat=0.0), NOW, lambda d: False) == final


def test_same_host_the_process_decides_not_the_heartbeat():
    assert effective_status(manifest(heartbeat=0.0), NOW, lambda d: True) == "running"
    assert effective_status(manifest(), NOW, lambda d: False) == "lost"


def test_other_host_the_heartbeat_decides():
    other_host: Callable[[dict], bool | None] = lambda d: None  # noqa: E731
    assert effective_status(manifest(heartbeat=NOW - 59), NOW, other_host) == "running"
    assert effective_status(manifest(heartbeat=NOW - 61), NOW, other_host) == "lost"
    assert effective_status(manifest(heartbeat=NOW - 61), NOW) == "lost", "no liveness check: heartbeat only"
    assert effective_status(manifest(heartbeat=NOW - 30), NOW, stale_after_s=20) == "lost"


def test_running_with_nothing_vouching_for_it_is_lost():
    assert effective_status({"status": "running"}, NOW) == "lost"
    assert effective_status(manifest(heartbeat=None), NOW) == "lost"
    assert effective_status({}, NOW) == "lost", "a run.json never written past its placeholder"
