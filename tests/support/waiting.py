"""Waiting for something to happen (processes starting up, files appearing): polling, not a timing assertion."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from typing import TypeVar

import pytest

T = TypeVar("T")


def wait_for(what: str, probe: Callable[[], T], timeout: float = 120, interval: float = 0.1,
             driver: subprocess.Popen | None = None) -> T:
    """Poll ``probe`` until it returns something truthy, and return that (processes starting up, files
    appearing: not a timing assertion). With ``driver``, fail at once, with its output, when it ends first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found := probe():
            return found
        if driver is not None and driver.poll() is not None:
            out, err = driver.communicate()
            pytest.fail(f"the driver ended (rc {driver.returncode}) before {what}:\n{out}\n{err}")
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}")
