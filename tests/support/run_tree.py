"""Reading what runs left under an output root: their run directories and JSON records, and copies to change."""

from __future__ import annotations

import json
import shutil
from pathlib import Path


def run_dirs(root: Path) -> list[Path]:
    """Every run directory (one holding config.yaml) under an output root."""
    return sorted(p.parent for p in root.rglob("config.yaml"))


def load_json(path: Path) -> dict:
    """The JSON record at ``path`` (run.json, summary.json, …)."""
    return json.loads(path.read_text())


def copy_run(run: Path, root: Path) -> Path:
    """A copy of the run directory ``run`` under the output root ``root`` (its ``<date>/<name>`` kept): a shared
    run that a test may continue, damage or prune without touching the one other tests read."""
    dest = root / run.parent.name / run.name
    shutil.copytree(run, dest)
    return dest
