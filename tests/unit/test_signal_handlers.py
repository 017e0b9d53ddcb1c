"""The one helper that takes signals for a block and gives them back (runner/contract/osutil.py: ``handle_signals``,
``restore_signals``), as the sweep pool, the Slurm follower, the supervisor, the driver's stop guard and the live bar
use it."""

from __future__ import annotations

import os
import signal

from ddp_runner.contract import osutil


def test_a_block_takes_its_signals_and_gives_back_the_handlers_it_found() -> None:
    seen: list[int] = []

    def before(signum: int, _frame: object) -> None:
        seen.append(-signum)

    original = signal.signal(signal.SIGUSR1, before)
    try:
        old = osutil.handle_signals((signal.SIGUSR1, signal.SIGUSR2), lambda s, _f: seen.append(s))
        assert old == {signal.SIGUSR1: before, signal.SIGUSR2: signal.SIG_DFL}
        os.kill(os.getpid(), signal.SIGUSR1)
        os.kill(os.getpid(), signal.SIGUSR2)
        assert seen == [signal.SIGUSR1, signal.SIGUSR2]
        osutil.restore_signals(old)
        assert signal.getsignal(signal.SIGUSR1) is before and signal.getsignal(signal.SIGUSR2) == signal.SIG_DFL
        os.kill(os.getpid(), signal.SIGUSR1)
        assert seen[-1] == -signal.SIGUSR1
    finally:
        signal.signal(signal.SIGUSR1, original)


def test_a_handler_set_outside_python_is_left_as_the_block_set_it() -> None:
    """None (a handler Python did not set) cannot be set again: restoring skips it rather than failing."""
    original = signal.getsignal(signal.SIGUSR2)
    try:
        signal.signal(signal.SIGUSR2, signal.SIG_IGN)
        osutil.restore_signals({signal.SIGUSR2: None})
        assert signal.getsignal(signal.SIGUSR2) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGUSR2, original)
