"""Fault injection in one place: the user's rehearsal faults (config ``fault.*``) and the checkpoint tests' hooks.

Rehearsal (documented in the README; checked before launch by runner/diagnostics/setup.py): ``fault.kind`` strikes
``fault.rank`` after its optimizer step ``fault.step``, on the first attempt of a launch only (so an elastic
restart can be shown to recover):

- ``exception``: raise a RuntimeError;
- ``oom``: on CUDA, allocate more than the device has free (a real CUDA out-of-memory error); on CPU, raise
  ``torch.OutOfMemoryError`` saying it is simulated (exhausting host memory would hurt the whole machine);
- ``sigkill``: the process kills itself with SIGKILL;
- ``hang``: the rank sleeps forever (the watchdog, or the collective timeout, ends the run);
- ``slow``: from that step on, the rank sleeps ``fault.slow_s`` after every step, and the others wait for it.

``fault.also`` lists more faults (same keys) that strike in the same launch, e.g. one rank fails while another
is stuck.

Test-only hooks for checkpoint tests (environment variables named in ``runner/contract/layout.py``), both held at the
save path's one hook point, between a checkpoint's payload and its commit marker (``storage.SaveHooks``):

- ``DDP_RUNNER_SLOW_SAVE=<step>:<seconds>``: hold that step's checkpoint write (a test keeps a background write
  in flight while a fault strikes).
- ``DDP_RUNNER_CKPT_TEST_PAUSE=<seconds>``: print a line to stderr and sleep, so a test can SIGKILL a process in
  the middle of a save.

:func:`save_hooks` hands them to the checkpoint code once; without either, the save path calls nothing here.

And one test-only hook for the rehearsal faults (its name: :data:`ENV_FAULT_GATE`):

- ``DDP_RUNNER_FAULT_GATE=<path>``: a fault holds (at most :data:`GATE_WAIT_S`) until that file exists, so a test
  lets it strike once it has seen what must come first (a tracker's point on its server) instead of hoping that a
  sleep was long enough on a busy machine.

And one for the stop tests (its name: :data:`ENV_STOP_AT`):

- ``DDP_RUNNER_STOP_AT=<phase>@<step>``: rank 0, entering ``phase`` (one of ``tasks/engine/phase.py``'s:
  ``validation``: a validation; ``checkpoint``: a save, or the wait for one; ``finish``: the end of training, its
  final checkpoint and validation done or a stop's checkpoint committed) at optimizer step ``step``, sends SIGINT to
  the driver (run.json names it) and waits until the stop has reached it (:func:`in_phase`), so that the stop lands
  in that phase whatever the machine's load.

And one for ``batch.per_rank=auto`` (its name: :data:`ENV_OOM_ABOVE`):

- ``DDP_RUNNER_OOM_ABOVE=<N>`` (or ``<N>@<rank>``: that rank only): a micro-step whose micro-batch holds more than
  ``N`` samples raises ``torch.OutOfMemoryError`` before its forward (:func:`micro_batch`), as a device too small
  for it would, so that the fitting (tasks/engine/micro_fit.py) is tested on the CPU.

Nothing else in the engine injects faults.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ddp_runner.contract import layout

KINDS = ("exception", "oom", "sigkill", "hang", "slow")
ENV_FAULT_GATE = "DDP_RUNNER_FAULT_GATE"
ENV_OOM_ABOVE = "DDP_RUNNER_OOM_ABOVE"
GATE_WAIT_S = 300.0  # a test that never opens the gate gets its fault late, not a run that hangs for ever


@dataclass(frozen=True)
class Fault:
    """One rehearsal fault: ``kind`` strikes ``rank`` after optimizer step ``step``."""

    kind: str
    rank: int
    step: int
    slow_s: float = 0.0


@dataclass(frozen=True)
class Faults:
    """The faults this process will inject."""

    at_step: tuple[Fault, ...] = ()
    slow_save: tuple[int, float] | None = None  # (step, seconds)
    commit_pause_s: float | None = None
    gate: str | None = None  # a file the rehearsal faults wait for
    oom_above: tuple[int, int | None] | None = None  # (samples, rank or None: every rank)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Faults:
        """The tests' hooks from the environment (no rehearsal fault)."""
        slow = env.get(layout.ENV_SLOW_SAVE)
        pause = env.get(layout.ENV_CKPT_TEST_PAUSE)
        oom = env.get(ENV_OOM_ABOVE)
        size, _, rank = (oom or "").partition("@")
        return cls(slow_save=(int(slow.partition(":")[0]), float(slow.partition(":")[2])) if slow else None,
                   commit_pause_s=float(pause) if pause else None, gate=env.get(ENV_FAULT_GATE) or None,
                   oom_above=(int(size), int(rank) if rank else None) if oom else None)


_active = Faults.from_env(os.environ)


def use(faults: Faults) -> None:
    """Replace the active faults (for a test that drives the engine's parts in-process)."""
    global _active
    _active = faults


def configure(fault: Mapping[str, Any] | None, env: Mapping[str, str] = os.environ) -> None:
    """Take the rehearsal fault from the run's config ``fault`` section (off on an elastic restart's attempt)."""
    global _active
    first = env.get("TORCHELASTIC_RESTART_COUNT", "0") == "0" and env.get("SLURM_RESTART_COUNT", "0") in ("0", "")
    if not fault or not fault.get("kind") or not first:  # a restart or a requeued Slurm job shows the recovery
        return
    specs = [fault, *(fault.get("also") or [])]  # ``fault.also``: more faults at once (one fails, one is stuck)
    at = tuple(Fault(str(f["kind"]), int(f.get("rank", 0)), int(f.get("step", 1)), float(f.get("slow_s") or 0.0))
               for f in specs)
    _active = Faults(at, _active.slow_save, _active.commit_pause_s, _active.gate, _active.oom_above)


def after_step(rank: int, step: int) -> None:
    """Inject the configured fault if this is its rank and step (``slow``: this step or any later one)."""
    for f in _active.at_step:
        if rank == f.rank and (step == f.step or (f.kind == "slow" and step > f.step)):
            if _active.gate is not None:
                _wait_for_gate(_active.gate)
            _inject(f, rank, step)


def micro_batch(rank: int, samples: int) -> None:
    """``DDP_RUNNER_OOM_ABOVE``: a micro-batch of more than its ``N`` samples runs out of memory on its rank."""
    oom = _active.oom_above
    if oom is not None and samples > oom[0] and oom[1] in (None, rank):
        import torch

        raise torch.OutOfMemoryError(f"{ENV_OOM_ABOVE}={oom[0]}: a micro-batch of {samples} samples on rank {rank}"
                                     " ran out of memory (simulated)")


def _wait_for_gate(path: str) -> None:
    deadline = time.monotonic() + GATE_WAIT_S
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)


def _inject(f: Fault, rank: int, step: int) -> None:
    where = f"injected fault on rank {rank} at step {step} (fault.kind={f.kind})"
    if f.kind == "exception":
        raise RuntimeError(where)
    if f.kind == "oom":
        _out_of_memory(where)
    if f.kind == "sigkill":
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    if f.kind == "hang":
        while True:
            time.sleep(3600)
    if f.kind == "slow":
        time.sleep(f.slow_s)


def _out_of_memory(where: str) -> None:
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        free, _total = torch.cuda.mem_get_info()
        # One allocation larger than what is free: the caching allocator raises a real OutOfMemoryError.
        torch.empty(free + (1 << 30), dtype=torch.uint8, device="cuda")
    raise torch.OutOfMemoryError(f"{where}: out of memory simulated on CPU (a real host OOM would hurt the machine)")


class CheckpointHooks:
    """The checkpoint tests' hooks (a ``storage.SaveHooks``): a save held between its payload and its commit."""

    def __init__(self, slow_save: tuple[int, float] | None, commit_pause_s: float | None) -> None:
        self.slow_save = slow_save
        self.commit_pause_s = commit_pause_s

    def before_commit(self, step: int, url: str) -> None:
        """Hold checkpoint ``step`` (``DDP_RUNNER_SLOW_SAVE``), then pause, saying so
        (``DDP_RUNNER_CKPT_TEST_PAUSE``)."""
        if self.slow_save is not None and self.slow_save[0] == step:
            time.sleep(self.slow_save[1])
        if self.commit_pause_s:
            print(f"{layout.ENV_CKPT_TEST_PAUSE}: payload of step {step} written to {url}, pausing before commit",
                  file=sys.stderr, flush=True)
            time.sleep(self.commit_pause_s)


def save_hooks() -> CheckpointHooks | None:
    """The hooks the active faults ask of checkpoint saves, or None (no test asked: saves run no hook)."""
    if _active.slow_save is None and not _active.commit_pause_s:
        return None
    return CheckpointHooks(_active.slow_save, _active.commit_pause_s)


ENV_STOP_AT = "DDP_RUNNER_STOP_AT"
STOP_WAIT_S = 60.0  # the stop reaches the ranks within a second; a driver that never passes it on fails the test


def in_phase(phase: str, rank: int, step: int, local_dir: str) -> None:
    """The stop tests' hook (``DDP_RUNNER_STOP_AT=<phase>@<step>``, read here: a rare call): on rank 0, in
    ``phase`` at step ``step``, SIGINT to the driver, then wait until the stop it passes on has reached this rank."""
    if rank != 0 or os.environ.get(ENV_STOP_AT) != f"{phase}@{step}":
        return
    import json

    from ddp_runner.tasks.engine.stop import signals

    with open(os.path.join(local_dir, layout.MANIFEST)) as f:
        driver = int(json.load(f)["driver"]["pid"])
    print(f"{ENV_STOP_AT}: SIGINT to the driver (pid {driver}) in {phase} at step {step}", file=sys.stderr, flush=True)
    os.kill(driver, signal.SIGINT)
    deadline = time.monotonic() + STOP_WAIT_S
    while not signals.requested() and time.monotonic() < deadline:
        time.sleep(0.01)
