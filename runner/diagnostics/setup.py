"""The driver's side of ``watchdog.*``, ``fault.*`` and ``debug``: checked before launch, turned into the workers'
environment, and the run tree's diagnostics folders made (private where they must be).

Standard library only at import (the driver never imports torch at start-up).
"""

from __future__ import annotations

import contextlib
import glob
import importlib.metadata
import importlib.util
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ddp_runner.contract import layout

# NCCL flight recorder entries kept per rank (torch's TORCH_NCCL_TRACE_BUFFER_SIZE; 0 = off): a few thousand
# collectives are enough to see which one a rank never joined, at a negligible cost.
NCCL_TRACE_ENTRIES = "2000"


FLIGHT_RECORDER_VARIABLES = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")


def flight_recorder_variable() -> str:
    """The name the installed torch reads for the flight recorder's size (read from its metadata and source, not
    imported: the driver never imports torch)."""
    version, source = None, ""
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        version = importlib.metadata.version("torch")
    spec = importlib.util.find_spec("torch")
    if spec is not None and spec.origin:
        with contextlib.suppress(OSError):
            source = Path(spec.origin).parent.joinpath("distributed", "distributed_c10d.py").read_text()
    return flight_recorder_variable_for(version, source)


def flight_recorder_variable_for(version: str | None, c10d_source: str) -> str:
    """``TORCH_FR_BUFFER_SIZE`` from torch 2.8 on (its C++ side then warns on every rank about the older
    ``TORCH_NCCL_TRACE_BUFFER_SIZE``, even where its Python side does not name the new one, as in 2.11), or when
    ``distributed_c10d.py`` names it; else the older name."""
    if FLIGHT_RECORDER_VARIABLES[0] in c10d_source:
        return FLIGHT_RECORDER_VARIABLES[0]
    m = re.match(r"(\d+)\.(\d+)", version or "")
    if m and (int(m.group(1)), int(m.group(2))) >= (2, 8):
        return FLIGHT_RECORDER_VARIABLES[0]
    return FLIGHT_RECORDER_VARIABLES[1]


def worker_env(conf: Mapping[str, Any], backend: str) -> dict[str, str]:
    """Variables the workers need for debug mode and NCCL's flight recorder (existing user settings win)."""
    env: dict[str, str] = {}
    if backend == "nccl" and (conf.get("watchdog") or {}).get("timeout_s"):
        name = flight_recorder_variable()
        if not any(os.environ.get(v) for v in FLIGHT_RECORDER_VARIABLES):
            env[name] = NCCL_TRACE_ENTRIES
    if conf.get("debug"):
        env.update({layout.ENV_DEBUG: "1", "NCCL_DEBUG": "INFO", "TORCH_DISTRIBUTED_DEBUG": "DETAIL",
                    "TORCH_CPP_LOG_LEVEL": "INFO"})
    return env


def prepare(local_dir: str, conf: Mapping[str, Any]) -> None:
    """Make the diagnostics folders in the local run tree: progress, stacks and (debug) the owner-only debug logs."""
    for rel in (layout.PROGRESS, layout.STACKS):
        folder = os.path.join(local_dir, rel)
        os.makedirs(folder, exist_ok=True)
        if rel == layout.PROGRESS:  # a continued run: the previous launch's records (and pids) are not this one's
            for name in os.listdir(folder):
                os.remove(os.path.join(folder, name))
    for rel in (layout.HANG_RECORD, layout.DUMP_REQUEST):  # an earlier launch's (staged back from a remote tree)
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(local_dir, rel))
    if conf.get("debug"):
        path = os.path.join(local_dir, layout.DEBUG_LOGS)
        os.makedirs(path, mode=0o700, exist_ok=True)
        os.chmod(path, 0o700)  # whatever the umask


def tidy(local_dir: str) -> None:
    """After the run: drop empty stack files (every rank opens one in case the watchdog asks) and the folders
    left empty, the dump request, and the temporary sibling of a rank file whose rank was killed in the middle of
    its atomic write (every rank has ended: no writer is left)."""
    for p in glob.glob(os.path.join(local_dir, layout.LOGS, ".rank*.tmp")):
        with contextlib.suppress(FileNotFoundError):
            os.remove(p)
    for rel in (layout.STACKS, layout.PROGRESS):
        folder = os.path.join(local_dir, rel)
        if not os.path.isdir(folder):
            continue
        for name in os.listdir(folder):
            p = os.path.join(folder, name)
            if name.startswith(".") or (os.path.isfile(p) and os.path.getsize(p) == 0):
                os.remove(p)
        if rel == layout.STACKS and not os.listdir(folder):
            os.rmdir(folder)
