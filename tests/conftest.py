"""Shared helpers: run the real CLI (Hydra → torchrun → gloo workers) in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

ROOT = Path(__file__).resolve().parent.parent
T = TypeVar("T")


def ddp_run(args: list[str], root: Path, timeout: float = 240, env: dict[str, str] | None = None,
            ) -> subprocess.CompletedProcess[str]:
    """``python -m runner <args> output.root=<root>`` as a user would type it."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "runner", *args, f"output.root={root}"], cwd=tempfile.gettempdir(),
                          env=full_env, capture_output=True, text=True, timeout=timeout)


def run_dirs(root: Path) -> list[Path]:
    """Every run directory (one holding config.yaml) under an output root."""
    return sorted(p.parent for p in root.rglob("config.yaml"))


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


def load_json(path: Path) -> dict:
    return json.loads(path.read_text())


@pytest.fixture
def out_root(tmp_path: Path) -> Path:
    """A fresh output root (not created yet: the driver makes it)."""
    return tmp_path / "outputs"
