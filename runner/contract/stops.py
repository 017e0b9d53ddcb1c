"""How a run stops on a signal, as the driver and the workers both read it: the pre-emption signal's name, the
grace a stop gets, and the status a stop ends in. Standard library only.

A stop is SIGINT/SIGTERM to the driver, SIGTERM to a worker, or the pre-emption signal
(``checkpoint.stop_signal``, default SIGUSR2: SIGUSR1 belongs to NCCL and to the heartbeat's faulthandler). The
ranks agree on it at the next optimizer-step boundary, save a complete checkpoint and end; the run is then
``interrupted``, or ``preempted`` when the pre-emption signal stopped it.
"""

from __future__ import annotations

import signal
from typing import TypedDict

from ddp_runner.contract import layout

DEFAULT_SIGNAL = "SIGUSR2"
DEFAULT_GRACE_S = 20.0
# torchrun SIGKILLs its workers 30 s after it tells them to stop; the driver waits the grace plus this margin.
MAX_GRACE_S = 25.0
DRIVER_MARGIN_S = 4.0
RESERVED = (signal.SIGUSR1, signal.SIGKILL, signal.SIGSTOP, signal.SIGINT)  # NCCL and faulthandler use SIGUSR1


class StopRecord(TypedDict):
    """What a rank records of a stop its ranks agreed on (its facts' ``stopped``, summary.json's ``stopped``): the
    driver's finalisation reads it to tell a stopped run from a completed one and to name the checkpoint to
    resume from."""

    step: int                       # the optimizer step every rank stopped after
    signal: int                     # the agreed stop signal's number
    checkpoint: str                 # the checkpoint that holds that step: ``step_<N>``
    save_s: float                   # seconds from the agreement to that checkpoint's commit
    signal_after_step: int | None   # the steps this rank had done when its signal came (None: it got none)
    during: str | None              # the work the stop cut short (a validation), else None
    last_step: bool                 # the step is the run's last (the stop cut its final validation short)


def parse_signal(value: object) -> int | None:
    """The signal number ``value`` names (``SIGUSR2``, ``USR2``, ``12``); None for null; ValueError otherwise."""
    if value is None or value == "":
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        num = value
    else:
        name = str(value).upper()
        if name.isdigit():
            num = int(name)
        else:
            name = name if name.startswith("SIG") else "SIG" + name
            sig = getattr(signal.Signals, name, None) if name in signal.Signals.__members__ else None
            if sig is None:
                raise ValueError(f"no signal named {value!r}")
            num = int(sig)
    if num in RESERVED or num not in {int(s) for s in signal.Signals}:
        raise ValueError(f"signal {value!r} cannot be the pre-emption signal")
    return num


def signal_name(num: int) -> str:
    """``SIGUSR2`` for 12 (the number as text when it has no name)."""
    try:
        return signal.Signals(num).name
    except ValueError:
        return str(num)


def of(checkpoint: dict | None) -> tuple[int | None, float]:
    """The pre-emption signal and the stop grace of a config's ``checkpoint`` section (defaults where unset)."""
    c = checkpoint or {}
    return parse_signal(c.get("stop_signal", DEFAULT_SIGNAL)), float(c.get("stop_grace_s") or DEFAULT_GRACE_S)


def stop_status(signum: int | None, preempt: int | None) -> str:
    """The status of a run stopped by ``signum``: ``preempted`` for the pre-emption signal, else ``interrupted``."""
    return layout.STATUS_PREEMPTED if preempt is not None and signum == preempt else layout.STATUS_INTERRUPTED
