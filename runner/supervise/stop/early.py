"""A stop signal in the driver's first milliseconds, while its own modules are still being imported: noted from the
entry module's first lines (a handler that only remembers the signal), and taken by :func:`guard.install` as soon
as ``ddp-run``'s main starts. Without it, a Ctrl-C then is a ``KeyboardInterrupt`` traceback, and one sent to a
driver started in the background (SIGINT inherited ignored) is lost. Standard library only: nothing is imported
before the handler is in place.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

_noted: list[int] = []       # the first stop signal that came before main
_replaced: dict[int, Any] = {}  # the handlers note() replaced, for guard.restore


def _note(signum: int, _frame: object) -> None:
    if not _noted:
        _noted.append(signum)


def note() -> None:
    """Remember (only) the first of SIGINT, SIGTERM and SIGHUP from now until :func:`take` is called (once). Only
    in the entry point: a program that imports the CLI keeps its own handlers."""
    if _replaced or threading.current_thread() is not threading.main_thread():
        return
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        _replaced[s] = signal.signal(s, _note)


def is_entry(argv0: str, script: str) -> bool:
    """Is this process the console script ``script`` (not a test or a program that imports the module)?"""
    return os.path.basename(argv0) == script


def take() -> tuple[int | None, dict[int, Any]]:
    """The signal noted before main (None: none came) and the handlers :func:`note` replaced; noting ends (the
    caller installs its own handlers first)."""
    signum = _noted.pop() if _noted else None
    replaced = dict(_replaced)
    _replaced.clear()
    return signum, replaced
