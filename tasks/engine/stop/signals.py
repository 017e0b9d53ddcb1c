"""Finish the checkpoint being written when a worker is told to stop, then stop as before.

torchrun stops every worker with SIGTERM when one of them fails, and so does the driver on Ctrl-C (through
torchrun). SIGTERM's default action ends the process at once, and with it a checkpoint that rank 0 was still
writing in the background: the run then resumes from the one before. Here, SIGTERM wakes a watcher thread, which
gives the registered work (``on_terminate``) up to ``grace_s`` to finish, then dies by SIGTERM's default action,
exactly as the process would have.

It must be a thread: when a peer has failed, the main thread is usually blocked inside a collective that will not
return, and Python runs signal handlers only in the main thread, between bytecodes. The C-level handler that
Python installs writes the signal's number to the "wakeup fd" whatever the main thread is doing; the watcher
blocks reading it.

A rank that fails on its own (its collective raised because a peer went away) runs the same work through
:func:`finish_now` before it exits, so its log says what became of the write either way. The work runs once:
whichever of the two gets there first does it, and the other waits for it.

A stop (SIGTERM, or the configured pre-emption signal, ``checkpoint.stop_signal``) that reaches a rank while its
training loop runs is a request, never work done in the handler: :func:`requested` says which signal came; the
loop's ranks agree on it at the next optimizer-step boundary (``tasks/engine/stop/vote.py``), save a complete
checkpoint and end normally, telling the watcher through :func:`taken` and :func:`done`. The watcher waits for that
(after finishing the write in flight: half the grace for the loop to take the stop, the rest for the save);
should the loop not take it in time (its
main thread is stuck in a collective whose peer is gone) or the save not finish, it says so and stops the process
as above: the last complete checkpoint stands.

After the last optimizer step the trainer calls :func:`taken` before the final checkpoint (a stop then waits for
that save) and :func:`done` once every step is in a committed checkpoint: a stop from there on (during the final
validation, which the ranks cut short at their next vote, or while the process finishes) loses nothing, and the
watcher lets the process end by itself.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from collections.abc import Callable

GRACE_S = 15.0  # inside torchrun's 30 s and the driver's 20 s before they SIGKILL

Work = Callable[[float, str], None]  # finish(timeout_s, why): why prefixes what it prints

_work: list[Work] = []
_work_lock = threading.Lock()
_owner_pid: int | None = None
_stop_signals: set[int] = {signal.SIGTERM}
_requested = 0                       # the stop signal that came (0: none)
_requested_after: int | None = None  # the optimizer steps this rank had done when it came
_accepting = threading.Event()       # the training loop runs and takes stops at step boundaries
_taken = threading.Event()           # the ranks agreed to stop: the checkpoint on stop is under way
_done = threading.Event()            # the checkpoint on stop is committed: the process ends by itself
_grace = [GRACE_S]
_steps_done: Callable[[], int | None] = lambda: None  # noqa: E731 - until the heartbeat tracks the steps


def requested() -> int:
    """The stop signal this process received (SIGTERM, or the pre-emption signal), 0 when none."""
    return _requested


def track_steps(steps_done: Callable[[], int]) -> None:
    """Where a stop signal finds this rank: ``steps_done()`` is read when one comes (see :func:`requested_after`)."""
    global _steps_done
    _steps_done = steps_done


def requested_after() -> int | None:
    """The optimizer steps this rank had finished when its stop signal came (None: no signal came)."""
    return _requested_after


def accept_stops(on: bool) -> None:
    """The training loop calls this as it starts (True) and ends (False): while on, a stop is taken at the next
    step boundary instead of ending the process."""
    if on:
        _accepting.set()
    else:
        _accepting.clear()


def taken() -> None:
    """A checkpoint of every step done is under way (the ranks agreed to stop, or the final checkpoint after the
    last step): a stop now waits for it (see :func:`done`)."""
    _taken.set()


def done() -> None:
    """Every step done is in a committed checkpoint (the checkpoint on stop, or the final one): nothing a stop could
    save is left, and the process ends by itself."""
    _taken.set()  # a stop that comes now needs no step boundary either
    _done.set()


def configure(grace_s: float, stop_signal: int | None) -> None:
    """After the config is read (main thread): the grace a stop gets (``checkpoint.stop_grace_s``) and the extra
    pre-emption signal handled like SIGTERM (``checkpoint.stop_signal``; None: SIGTERM only)."""
    _grace[0] = grace_s
    if stop_signal and stop_signal not in _stop_signals and _owner_pid == os.getpid():
        signal.signal(stop_signal, _handler)
        _stop_signals.add(stop_signal)


def on_terminate(finish: Work) -> None:
    """Register ``finish(timeout_s, why)``: called on SIGTERM, from the watcher thread, before the process stops
    (or by :func:`finish_now`)."""
    _work.append(finish)


def finish_now(why: str, grace_s: float = GRACE_S) -> None:
    """Run the registered work now, once, giving it ``grace_s`` in all; for a rank about to exit after an error."""
    _run_work(grace_s, why)


def forget(finish: Work) -> None:
    """Unregister what :func:`on_terminate` registered (absent: nothing happens)."""
    if finish in _work:
        _work.remove(finish)


def install(grace_s: float = GRACE_S) -> bool:
    """Handle SIGTERM as described above (Python only lets the main thread set signal handlers).

    Returns False (and changes nothing) when not called from the main thread.
    """
    global _owner_pid
    if threading.current_thread() is not threading.main_thread():
        return False
    _owner_pid = os.getpid()
    _grace[0] = grace_s
    r, w = os.pipe()
    os.set_blocking(w, False)
    signal.signal(signal.SIGTERM, _handler)
    signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    threading.Thread(target=_watch, args=(r,), name="sigterm-watch", daemon=True).start()
    return True


def reset_in_child(*_args: object) -> None:
    """For processes forked from a worker (DataLoader workers, as ``worker_init_fn``): SIGTERM's default action
    again, and no writes to the parent's wakeup pipe."""
    signal.set_wakeup_fd(-1)
    for s in _stop_signals:
        signal.signal(s, signal.SIG_DFL)


def shield_loader_worker(*_args: object) -> None:
    """``worker_init_fn`` of the DataLoader's workers: they ignore the stop signals. torchrun stops a rank by
    signalling its whole process group, loader workers included, and a worker killed by it fails the rank (its
    SIGCHLD check raises) while the rank saves its checkpoint on stop. They end with the rank instead: the
    DataLoader shuts them down, and they exit by themselves once the rank is gone."""
    signal.set_wakeup_fd(-1)
    for s in _stop_signals:
        signal.signal(s, signal.SIG_IGN)


def _handler(signum: int, _frame: object) -> None:
    # Python-level handler. In the worker itself the watcher thread does the work. A forked child that has not
    # reset itself yet dies as it would have without this module.
    if os.getpid() != _owner_pid:
        reset_in_child()
        os.kill(os.getpid(), signum)


def _run_work(grace_s: float, why: str) -> None:
    deadline = time.monotonic() + grace_s
    with _work_lock:  # SIGTERM while finish_now is at work: the watcher waits for it, then stops the process
        work = list(_work)
        _work.clear()
        for finish in work:
            try:
                finish(max(0.0, deadline - time.monotonic()), why)
            except BaseException as exc:  # noqa: BLE001 - stopping anyway; say why the work did not finish
                print(f"{why}: {exc!r}", flush=True)


def _watch(fd: int) -> None:
    global _requested, _requested_after
    signum = 0
    while not signum:  # the wakeup fd carries every handled signal's number
        signum = next((b for b in os.read(fd, 64) if b in _stop_signals), 0)
    _requested_after = _steps_done()
    _requested = signum
    grace_s = _grace[0]
    t0 = time.monotonic()
    deadline = t0 + grace_s
    # The write in flight is finished first, whatever comes next (the loop's own save waits for it anyway).
    _run_work(grace_s, "SIGTERM")
    if _done.is_set():
        return  # every step is committed: the main thread ends the process (a validation at its next vote)
    if _accepting.is_set() or _taken.is_set():
        if _taken.wait(max(0.0, t0 + grace_s / 2 - time.monotonic())):
            if _done.wait(max(0.0, deadline - time.monotonic())):
                return  # the checkpoint on stop is committed; the main thread ends the process
            print(f"stop: the checkpoint on stop did not finish within {grace_s:.0f} s (checkpoint.stop_grace_s);"
                  " the last complete checkpoint stands", flush=True)
        else:
            print(f"stop: training did not reach a step boundary within {grace_s / 2:.0f} s of signal {signum};"
                  " stopping without a checkpoint on stop (the last complete checkpoint stands)", flush=True)
    sys.stdout.flush()
    sys.stderr.flush()
    # Die by SIGTERM's default action. Python's signal.signal only works in the main thread, which may be
    # blocked; libc's signal() works from any thread.
    ctypes.CDLL(None).signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)
