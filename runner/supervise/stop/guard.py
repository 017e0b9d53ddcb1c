"""The driver's stop outside torchrun's supervision: from its first line to its last, a stop signal (SIGINT, SIGTERM,
SIGHUP, the default pre-emption signal) ends in one console line, never a traceback, and never leaves a run
directory without its records.

``ddp-run``'s main is :func:`guarded`: the handlers come first thing, before Hydra is imported. A driver started in
the background of a non-interactive shell inherits SIGINT ignored (POSIX), and would otherwise ignore it until the
supervisor's own handler, most of a second later. A signal that came while the CLI's modules loaded was noted by
early.py (installed by the entry module's first lines) and is taken as main starts.

- Before a job opens its run directory, the handler raises :class:`Stopped`, which ends the driver with one line and
  exit 128 + the signal, its ``finally`` blocks run (a planning probe cancelled, Hydra's held-back stderr restored).
- From the run directory's opening to the job's end (:func:`deferred`), the signal is only noted: the job takes it
  (:func:`take`) before it records the launch (a new run directory is removed, a continued one left as it was), the
  supervisor takes one that comes after (torchrun is not started; the run is recorded ``interrupted``), and one that
  comes while the run is finalised changes nothing (its records are written whole).
- While torchrun runs, the supervisor's handlers take over (runner/supervise/stop/forward.py): the ranks save.
"""

from __future__ import annotations

import contextlib
import functools
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

from ddp_runner.console import textfit
from ddp_runner.contract import stops
from ddp_runner.contract.osutil import handle_signals, restore_signals
from ddp_runner.supervise.stop import early

_pending: list[int] = []  # the first signal noted while deferred
_deferring = [0]          # depth of nested deferred() blocks
_received: list[int] = []  # the first stop signal this driver took, whichever handler took it: a sweep ends on it


class Stopped(BaseException):  # noqa: N818 - a stop, not an error; BaseException: no ``except Exception`` takes it
    """A stop signal came before anything was launched."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by {stops.signal_name(signum)}")
        self.signum = signum


def stop_signals() -> tuple[int, ...]:
    """The signals a driver stops on: Ctrl-C, a scheduler's SIGTERM, a closed terminal, the pre-emption signal."""
    return signal.SIGINT, signal.SIGTERM, signal.SIGHUP, stops.of({})[0]


def install() -> dict[int, Any]:
    """Handle :func:`stop_signals` as the module docstring says; returns the handlers they had before the entry
    module noted a stop (for :func:`restore`). Nothing changes off the main thread (Python sets handlers there
    only). A signal noted before (runner/supervise/stop/early.py) raises :class:`Stopped` at once."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    _pending.clear()
    _received.clear()
    old = handle_signals(stop_signals(), _handler)
    signum, replaced = early.take()
    old.update(replaced)
    if signum is not None:
        restore(old)
        raise Stopped(signum)
    return old


def restore(old: dict[int, Any]) -> None:
    """Put back the handlers :func:`install` replaced."""
    restore_signals(old)


def guarded(jobs: Callable[[], int]) -> Callable[[Callable[[], None]], Callable[[], None]]:
    """Decorate a console entry point: the stop handlers installed as it starts and put back as it ends; a
    :class:`Stopped` said in one line and turned into exit 128 + the signal. ``jobs``: how many jobs it had begun
    (a sweep's earlier jobs ended before the stop)."""
    def decorate(entry: Callable[[], None]) -> Callable[[], None]:
        @functools.wraps(entry)
        def run() -> None:
            old: dict[int, Any] = {}
            try:
                old = install()
                entry()
            except Stopped as stop:
                begun = jobs()
                more = "nothing was started" if begun <= 1 else f"nothing more was started ({begun - 1} jobs ended)"
                say(f"ddp-run: stopped by {stops.signal_name(stop.signum)} before launching: {more}")
                sys.exit(128 + stop.signum)
            finally:
                restore(old)

        return run

    return decorate


def note(signum: int) -> None:
    """Remember that this driver was asked to stop (the supervisor's handler says so too): a sequential sweep
    starts no further job (:func:`received`)."""
    if not _received:
        _received.append(signum)


def received() -> int | None:
    """The first stop signal this driver took since :func:`install` (None: none came)."""
    return _received[0] if _received else None


def _handler(signum: int, _frame: object) -> None:
    note(signum)
    if _deferring[0]:
        if not _pending:
            _pending.append(signum)
        return
    raise Stopped(signum)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """A block (a run directory being made, recorded, launched, finalised) that a stop must not cut in two: a
    signal inside it is noted for :func:`take`; one that nobody took is forgotten when the outermost block ends
    (the job's own outcome stands)."""
    _deferring[0] += 1
    try:
        yield
    finally:
        _deferring[0] -= 1
        if not _deferring[0]:
            _pending.clear()


def take() -> int | None:
    """The stop signal noted in a :func:`deferred` block, once (None: none came)."""
    return _pending.pop() if _pending else None


def say(line: str) -> None:
    """One console line on stderr; a terminal closed by SIGHUP is no reason for a traceback."""
    with contextlib.suppress(OSError, ValueError):
        textfit.say(line, sys.stderr, flush=True)
