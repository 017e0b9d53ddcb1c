"""Every rank agrees on a stop at an optimizer-step boundary (NeMo's pattern): a signal only sets a flag
(``signals.requested``); here the ranks reduce it with one tiny all-reduce (MAX of a 1-element tensor), so that
all of them see the same answer at the same step and take part in one complete checkpoint.

A validation votes after each of its batches (every rank the same number of times), so that a stop during it is
taken at once, the validation cut short (:class:`StopAgreed`), not after it.

On a log step the vote rides in the gather the step's logged values already make (``PendingLog``): no collective
of its own (with ``train.log_every=1``, the default, none at all); the other steps take :meth:`StopAgreement.poll`.

On CUDA the reduced flag travels to the host without a sync: round k is read at the boundary of step k+1 (its
copy finished long ago: the host runs about a step ahead of the device), so a stop costs at most one more step of
latency and no work (the checkpoint covers every step done). On CPU (gloo) the collective is synchronous anyway
and the answer is read at once.
"""

from __future__ import annotations

import json
import os
import time

import torch
import torch.distributed as dist

from ddp_runner.tasks.engine.stop import signals


class StopAgreed(Exception):  # noqa: N818 - an agreement, not an error: the ranks leave the work it cut short
    """Every rank agreed to stop inside work that is not an optimizer step (a validation): raised by that work at
    the same vote on every rank, so that all of them leave it together and save."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"the ranks agreed to stop (signal {signum})")
        self.signum = signum


class StopAgreement:
    """The per-step stop vote of this rank; :meth:`poll` returns the agreed signal number (0: go on)."""

    def __init__(self, device: torch.device, enabled: bool = True, request_file: str | None = None) -> None:
        self.device, self.enabled, self.request_file = device, enabled, request_file
        self._looked, self._asked = 0.0, 0
        self.polls, self.host_s = 0, 0.0  # what the vote cost this rank's host (bench/stop_latency.py)
        self.folded = 0  # votes carried by the log step's gather instead
        self.lagged = device.type == "cuda"
        self._pending: torch.cuda.Event | None = None
        if self.lagged and enabled:
            self._send = torch.zeros(1, dtype=torch.int32, pin_memory=True)
            self._dev = torch.zeros(1, dtype=torch.int32, device=device)
            self._recv = torch.zeros(1, dtype=torch.int32, pin_memory=True)

    def poll(self) -> int:
        """Collective (every rank calls it at every optimizer-step boundary): the stop signal any rank has
        received, as agreed by all (0 when none, or when disabled)."""
        if not self.enabled:
            return 0
        t0 = time.perf_counter()
        try:
            return self._vote()
        finally:
            self.polls += 1
            self.host_s += time.perf_counter() - t0

    def mine(self) -> int:
        """This rank's vote, for a collective that carries it (the log step's gather): no collective here."""
        if not self.enabled:
            return 0
        self.folded += 1
        return signals.requested() or self._requested_by_file()

    def stats(self) -> dict[str, float] | None:
        """How many votes this rank took part in and their mean host time (None when disabled)."""
        if not self.enabled:
            return None
        return {"polls": self.polls, "mean_us": 1e6 * self.host_s / max(1, self.polls) if self.polls else None,
                "folded": self.folded}

    def _vote(self) -> int:
        mine = signals.requested() or self._requested_by_file()
        if not self.lagged:
            flag = torch.tensor([mine], dtype=torch.int32)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            return int(flag.item())
        agreed = 0
        if self._pending is not None:  # the previous round's answer: every rank reads the same round
            self._pending.synchronize()
            agreed = int(self._recv.item())
        self._send.fill_(mine)
        self._dev.copy_(self._send, non_blocking=True)
        dist.all_reduce(self._dev, op=dist.ReduceOp.MAX)
        self._recv.copy_(self._dev, non_blocking=True)
        self._pending = torch.cuda.Event()
        self._pending.record()
        return agreed

    def _requested_by_file(self) -> int:
        """The signal a driver asked for through ``layout.STOP_REQUEST`` (rank 0 only, about once a second)."""
        if self.request_file is None or self._asked or time.monotonic() - self._looked < 1.0:
            return self._asked
        self._looked = time.monotonic()
        if os.path.exists(self.request_file):  # once asked, asked until the end (as a signal is)
            try:
                with open(self.request_file) as f:
                    self._asked = int(json.load(f).get("signal") or 15)
            except (OSError, ValueError):
                self._asked = 15  # a request being written: a stop all the same (SIGTERM)
        return self._asked
