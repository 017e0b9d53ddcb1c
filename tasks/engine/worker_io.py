"""What a worker writes about itself into the run directory: its log, its facts, its error record."""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from typing import IO, Any

from ddp_runner.contract import layout, secrets
from ddp_runner.contract.osutil import atomic_write


def redirect_output(local_dir: str, rank: int) -> IO[str] | None:
    """Send this process's stdout/stderr (C-level too, e.g. NCCL's) to ``logs/rank<R>.log``.

    Returns rank 0's console (its progress and messages for the user: see tasks/engine/reporting/progress.py), else
    None.
    """
    from ddp_runner.tasks.engine.reporting.progress import open_console

    path = os.path.join(local_dir, layout.rank_log(rank))
    # the driver makes logs/; a run directory made by hand for a dry run's pasted line may not have it
    os.makedirs(os.path.dirname(path), exist_ok=True)
    console = open_console(local_dir) if rank == 0 else None
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
    sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)
    if masks := _masks():  # the log is on disk: the config's secrets never reach it (Python's writes at least)
        sys.stdout = secrets.MaskedStream(sys.stdout, lambda: masks)
        sys.stderr = secrets.MaskedStream(sys.stderr, lambda: masks)
    return console


def _masks() -> list[str]:
    return secrets.handed_over()




def write_json(local_dir: str, rel: str, obj: dict[str, Any]) -> None:
    """Write a small JSON file atomically (rename), so the driver never reads half of it."""
    atomic_write(os.path.join(local_dir, rel), json.dumps(obj, indent=2))


_FAILED_AT = "_ddp_runner_failed_at"


def mark_failure_time(exc: BaseException) -> None:
    """Note when ``exc`` reached the engine, before clean-up (tearing down the process group) runs.

    The driver names the rank whose error came first as the root cause. Stamped only at writing time, the
    failing rank's record could come *after* a peer's, whose collective fails as soon as the process group is
    torn down.
    """
    if not hasattr(exc, _FAILED_AT):
        try:
            setattr(exc, _FAILED_AT, time.time())
        except (AttributeError, TypeError):  # an exception type that takes no attributes: stamped when written
            pass


def record_error(local_dir: str, rank: int, exc: BaseException) -> None:
    """Leave ``logs/rank<R>.error.json``: when (see :func:`mark_failure_time`), what type, the last traceback
    lines, and the line of the task's own code it came from (None when it did not)."""
    from ddp_runner.tasks.registry import where_in_task

    lines = [secrets.redact(line, _masks()) for line in traceback.format_exception(exc)]
    tail = "".join(lines).rstrip().splitlines()[-12:]
    try:
        where = where_in_task(exc)
    except Exception:  # noqa: BLE001 - the record matters more than this hint
        where = None
    write_json(local_dir, layout.rank_error(rank), {
        "rank": rank,
        "time": getattr(exc, _FAILED_AT, time.time()),
        "type": type(exc).__name__,
        "message": secrets.redact(str(exc), _masks())[:2000],
        "traceback": tail,
        # The innermost line of the task's own code (tasks/registry.py), when the error came from there.
        "where": where,
    })
