"""Runs made once per test session and shared by every xdist worker: whichever worker asks first launches it, the
others wait for it (a file lock) and read the same run directory. Tests only read a shared run (a test that
continues or damages one works on a copy: ``run_tree.copy_run``)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.driver import ddp_run
from tests.support.recipes import GPT_DROPOUT_STEPS
from tests.support.run_tree import load_json, run_dirs


def shared_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder every worker of this session sees (xdist gives each worker a basetemp of its own below it)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def shared_run(tmp_path_factory: pytest.TempPathFactory, name: str, make: Callable[[Path], Path]) -> Path:
    """The run directory ``make(root)`` leaves under a fresh output root, made by whichever worker asks first;
    the others wait for it (a file lock) and get the same directory. Tests must only read it."""
    from filelock import FileLock

    base = shared_base(tmp_path_factory) / f"shared-{name}"
    record = base.with_suffix(".json")
    with FileLock(str(base) + ".lock"):
        if record.exists():
            return Path(load_json(record)["run"])
        run = make(base / "outputs")
        record.write_text(json.dumps({"run": str(run)}))
        return run


def _console_of(run: Path) -> Path:
    """Where a shared run's fixture keeps what the launch printed (beside the run directory, not in it)."""
    return run.parent / f"{run.name}.console.json"


def shared_console(run: Path) -> dict:
    """A shared run's launch as seen from outside: ``stdout``, ``stderr``, ``rc`` and ``outside_s`` (seconds)."""
    return load_json(_console_of(run))


def keep_console(run: Path, record: dict) -> None:
    """Keep ``record`` (what a launch printed, and more) where :func:`shared_console` reads it."""
    _console_of(run).write_text(json.dumps(record))


def launch_shared(root: Path, args: list[str], ok: bool = True, env: dict[str, str] | None = None) -> Path:
    """The one run directory ``ddp_run(args)`` leaves under ``root``, its console kept (:func:`shared_console`);
    ``ok``: the launch must succeed."""
    t0 = time.monotonic()
    r = ddp_run(args, root, env=env)
    outside_s = time.monotonic() - t0
    if ok:
        assert r.returncode == 0, r.stdout + r.stderr
    [run] = run_dirs(root)
    keep_console(run, {"stdout": r.stdout, "stderr": r.stderr, "rc": r.returncode, "outside_s": outside_s})
    return run


def uninterrupted_gpt_run(tmp_path_factory: pytest.TempPathFactory, name: str, args: list[str]) -> Path:
    """The shared run ``name`` of ``args``: completed, all GPT_DROPOUT_STEPS steps."""
    def make(root: Path) -> Path:
        r = ddp_run(args, root)
        assert r.returncode == 0, r.stdout + r.stderr
        [run] = run_dirs(root)
        assert load_json(run / "summary.json")["steps"] == GPT_DROPOUT_STEPS
        return run

    return shared_run(tmp_path_factory, name, make)
