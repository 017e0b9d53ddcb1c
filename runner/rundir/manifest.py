"""run.json and summary.json: what a reviewer reads to know what ran, where, and how it ended (their shapes:
runner/contract/run_files.py)."""

from __future__ import annotations

import importlib.metadata
import json
import platform
import re
import socket
import subprocess
from datetime import datetime
from pathlib import Path
from typing import Any

from ddp_runner.config.plan import Plan
from ddp_runner.contract import layout
from ddp_runner.contract.run_files import Invocation, RunManifest
from ddp_runner.rundir.status import this_driver

PROJECT_ROOT = Path(__file__).resolve().parent.parent  # a checkout (conf/, tasks/, runner/), or site-packages
COMPLETED_LINE = re.compile(r"^rank (\d+) device (\S+) completed$", re.M)


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def git_commit(root: Path = PROJECT_ROOT) -> dict[str, Any] | None:
    """The project's commit and whether the tree had local changes; None when not run from its own checkout
    (an installed package's site-packages may sit inside some other repository)."""
    if not (root / "pyproject.toml").is_file() or not (root / ".git").exists():
        return None
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                                timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10).stdout.strip() != ""
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": commit, "dirty": dirty}


def initial_manifest(plan: Plan, command: list[str], task: str, started: datetime,
                     invocation: Invocation | None = None, data: dict[str, Any] | None = None) -> RunManifest:
    """run.json as written before launch (status running; its shape: runner/contract/run_files.py). ``invocation``:
    how the run was asked for (command line, overrides, task preset); ``data``: the data's source, size and hash."""
    return {
        "status": layout.STATUS_RUNNING,
        "task": task,
        "invocation": invocation or {},
        "data": data,
        "plan": plan.to_manifest(),
        "command": command,
        "versions": {"ddp_runner": _version("ddp-runner"), "python": platform.python_version(),
                     "torch": _version("torch"), "hydra": _version("hydra-core"), "nccl": None},
        "host": socket.gethostname(),
        # Who writes this run directory, and that it is still alive (runner/rundir/status.py): refreshed while it runs.
        "driver": this_driver(),
        "devices": [
            {"local_rank": i, "physical_index": g.physical_index, "name": g.name, "uuid": g.uuid}
            for i, g in enumerate(plan.gpus)
        ] or [{"local_rank": i, "device": "cpu"} for i in range(plan.nproc_per_node)],
        "git": git_commit(),
        "started": started.isoformat(timespec="seconds"),
        "ended": None,
        "exit_codes": {},
        "restarts": 0,
    }


def read_rank_files(local_dir: str, world_size: int) -> tuple[dict[int, dict], dict[int, dict], dict[int, str]]:
    """Each rank's facts, error record and log text (missing ones are absent)."""
    facts, errors, logs = {}, {}, {}
    for r in range(world_size):
        for store, rel in ((facts, layout.rank_facts(r)), (errors, layout.rank_error(r))):
            p = Path(local_dir, rel)
            if p.exists():
                try:
                    store[r] = json.loads(p.read_text())
                except json.JSONDecodeError:
                    pass
        log = Path(local_dir, layout.rank_log(r))
        if log.exists():
            logs[r] = log.read_text(errors="replace")
    return facts, errors, logs


def completion_check(logs: dict[int, str], world_size: int) -> dict[str, Any]:
    """Did every rank print ``rank R device D completed`` on a distinct device?"""
    seen: dict[int, str] = {}
    for text in logs.values():
        for m in COMPLETED_LINE.finditer(text):
            seen[int(m.group(1))] = m.group(2)
    devices = list(seen.values())
    return {
        "completed_ranks": sorted(seen),
        "devices": {str(r): d for r, d in sorted(seen.items())},
        "all_completed": sorted(seen) == list(range(world_size)),
        "distinct_devices": len(set(devices)) == len(devices) == world_size,
    }
