"""Fault injection for tests, in one place, read once when a worker starts.

Tests rehearse failures by setting environment variables for the workers (names in ``runner/layout.py``):

- ``DDP_RUNNER_FAULT=<kind>@<rank>:<step>[,…]``: after optimizer step ``step`` on ``rank``, ``raise`` an
  exception, ``kill`` the process (SIGKILL) or ``hang`` (sleep). Only the first attempt of a run is faulted, so an
  elastic restart (or a requeued Slurm job) can be shown to recover.
- ``DDP_RUNNER_SLOW_SAVE=<step>:<seconds>``: hold that step's background checkpoint write.
- ``DDP_RUNNER_CKPT_TEST_PAUSE=<seconds>``: print a line to stderr and sleep between a checkpoint's payload and
  its commit, so a test can SIGKILL a process in the middle of a save.

Nothing else in the engine reads these variables.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import dataclass, field

from runner import layout


@dataclass(frozen=True)
class Faults:
    """The faults asked for in this process's environment."""

    at_step: dict[tuple[int, int], str] = field(default_factory=dict)  # (rank, step) -> raise|kill|hang
    slow_save: tuple[int, float] | None = None  # (step, seconds)
    commit_pause_s: float | None = None

    @classmethod
    def from_env(cls, env: dict[str, str]) -> Faults:
        """Parse the test variables (an elastic restart's attempt gets no step faults)."""
        at: dict[tuple[int, int], str] = {}
        spec = env.get(layout.ENV_FAULT, "")
        first = env.get("TORCHELASTIC_RESTART_COUNT", "0") == "0" and env.get("SLURM_RESTART_COUNT", "0") in ("0", "")
        if spec and first:
            for one in spec.split(","):
                kind, _, where = one.partition("@")
                r, _, s = where.partition(":")
                at[(int(r), int(s))] = kind
        slow = env.get(layout.ENV_SLOW_SAVE)
        pause = env.get(layout.ENV_CKPT_TEST_PAUSE)
        return cls(at, (int(slow.partition(":")[0]), float(slow.partition(":")[2])) if slow else None,
                   float(pause) if pause else None)


_active = Faults.from_env(dict(os.environ))


def use(faults: Faults) -> None:
    """Replace the faults read from the environment (for a test that drives the engine's parts in-process)."""
    global _active
    _active = faults


def after_step(rank: int, step: int) -> None:
    """Raise, die or hang here if a test asked for it at this rank and step."""
    kind = _active.at_step.get((rank, step))
    if kind == "raise":
        raise RuntimeError(f"injected fault on rank {rank} at step {step}")
    if kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if kind == "hang":
        time.sleep(10**6)


def slow_save(step: int) -> None:
    """Hold the background write of checkpoint ``step`` if a test asked for it."""
    if _active.slow_save is not None and _active.slow_save[0] == step:
        time.sleep(_active.slow_save[1])


def pause_before_commit(step: int, url: str) -> None:
    """Pause between a checkpoint's payload and its commit marker if a test asked for it."""
    if _active.commit_pause_s:
        print(f"{layout.ENV_CKPT_TEST_PAUSE}: payload of step {step} written to {url}, pausing before commit",
              file=sys.stderr, flush=True)
        time.sleep(_active.commit_pause_s)
