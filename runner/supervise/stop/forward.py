"""A stop while torchrun runs, as the supervisor (runner/supervise/supervisor.py) handles it.

A first signal is forwarded (SIGTERM to torchrun, which passes it to the workers: they agree at the next optimizer
step, save a complete checkpoint and end), or, where a signal would cancel the step (Slurm's srun), asked through
the stop-request file that rank 0 reads; torchrun gets the stop grace plus a margin before it is killed. A second
signal stops everything at once, without waiting for the checkpoint. A stop noted while the launch was recorded
(:func:`~ddp_runner.supervise.stop.guard.take`) means torchrun never starts.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

from ddp_runner.console import textfit
from ddp_runner.contract import stops
from ddp_runner.supervise.stop import guard


def detach_terminal() -> None:
    """After SIGHUP the terminal is gone and writing to it fails (EIO): the console goes to /dev/null from here
    on (the run's own files say everything). Output sent to a file or pipe is left as it is."""
    null = None
    for fd in (1, 2):
        try:
            if os.isatty(fd):
                null = os.open(os.devnull, os.O_WRONLY) if null is None else null
                os.dup2(null, fd)
        except OSError:
            pass
    if null is not None:
        os.close(null)


class TorchrunStop:
    """The stop of one supervised torchrun (``proc``, once started): the signals that stop it, what the first and
    a second one do, and how long torchrun has to end. ``interrupted``: the first stop signal, or None."""

    def __init__(self, preempt: int | None, grace_s: float, request_file: str | None) -> None:
        # Where to ask the ranks to stop instead of signalling (srun cancels its step on a signal), if anywhere.
        self.request_file = request_file
        self.preempt, self.grace_s = preempt, grace_s + stops.DRIVER_MARGIN_S
        self.proc: subprocess.Popen[bytes] | None = None
        self.interrupted: int | None = None

    def signals(self) -> set[int]:
        """The signals that stop the run: SIGHUP (the terminal or ssh session closed) is one like SIGTERM, and so is
        the pre-emption signal; the run ends with its checkpoint."""
        return {signal.SIGINT, signal.SIGTERM, signal.SIGHUP} | ({self.preempt} if self.preempt else set())

    def forget_earlier_request(self) -> None:
        """Remove an earlier attempt's stop request, which would stop this one at once."""
        if self.request_file is not None and os.path.exists(self.request_file):
            os.remove(self.request_file)

    def on_signal(self, signum: int, _frame: Any) -> None:
        """The handler while torchrun runs: the first signal asks the ranks to save and stop, a second one kills."""
        if signum == signal.SIGHUP:
            detach_terminal()
        guard.note(signum)  # a sweep starts no further job
        alive = self.proc is not None and self.proc.poll() is None
        if self.interrupted is not None:  # a second signal: at once, without the checkpoint
            textfit.say(f"ddp-run: {stops.signal_name(signum)} again: stopping at once, without the checkpoint on stop",
                        sys.stderr, flush=True)
            if alive:
                self.proc.kill()  # the workers die with torchrun (their parent-death signal is SIGKILL)
            return
        # Said at once: stopping can take seconds, and silence invites a second Ctrl-C.
        textfit.say(f"ddp-run: stopping on {stops.signal_name(signum)}: every rank saves a checkpoint of its last"
                    " optimizer step, at the next step boundary or, after the last step, at once (up to"
                    f" {self.grace_s - stops.DRIVER_MARGIN_S:.0f} s, checkpoint.stop_grace_s); press Ctrl-C again to"
                    " stop at once without it", sys.stderr, flush=True)
        self.interrupted = signum
        if self.request_file is not None:
            with open(self.request_file, "w") as f:  # rank 0 reads it within a second; the signal follows the grace
                json.dump({"signal": signum}, f)
        elif alive:
            self.proc.send_signal(signal.SIGTERM)  # torchrun's agent then stops its workers

    def taken_early(self) -> int | None:
        """The stop signal that came as the launch was recorded (None: none came). Torchrun is then never started,
        and the run is recorded interrupted, as if its ranks had stopped at once."""
        if (early := guard.take()) is None:
            return None
        if early == signal.SIGHUP:
            detach_terminal()
        guard.say(f"ddp-run: stopped by {stops.signal_name(early)} before torchrun started")
        self.interrupted = early
        return early

    def wait_out(self) -> int:
        """After the first signal: give torchrun the grace to end (asked by file: then the signal, and 5 s more),
        then kill it; its exit code."""
        assert self.proc is not None
        deadline = time.monotonic() + self.grace_s
        while time.monotonic() < deadline and self.proc.poll() is None:
            time.sleep(0.2)
        if self.request_file is not None and self.proc.poll() is None:  # asked, not signalled: now the signal
            self.proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and self.proc.poll() is None:
                time.sleep(0.2)
        if self.proc.poll() is None:
            self.proc.kill()
        return self.proc.wait()
