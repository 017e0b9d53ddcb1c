"""What this rank saves when its ranks agree to stop, and when; and the end of training, ordered so that a stop
from the last step on loses nothing: the final checkpoint first, then the final validation.

A stop the ranks agree on (``vote``) after a step, or inside a validation, ends with one complete checkpoint of
that step, committed before the process ends; the record of it (:class:`~ddp_runner.contract.stops.StopRecord`)
goes into the rank's facts and the summary, where the driver reads it. The watcher of ``signals`` learns through
``taken`` and ``done`` what is under way.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator

from ddp_runner.contract import layout
from ddp_runner.contract.stops import StopRecord
from ddp_runner.tasks.engine.checkpoint.manager import CheckpointManager
from ddp_runner.tasks.engine.config import Config
from ddp_runner.tasks.engine.rank import Context
from ddp_runner.tasks.engine.reporting.log_step import Loop
from ddp_runner.tasks.engine.stop import signals
from ddp_runner.tasks.engine.stop.vote import StopAgreed, StopAgreement
from ddp_runner.tasks.engine.train_state import TrainState
from ddp_runner.tasks.engine.validation import Phase, Validator


class StopController:
    """This launch's stops: the vote (:meth:`begin`), the save on a stop (:meth:`stop`), the end of training
    (:meth:`end`). ``save(loop, final)`` checkpoints where training stands (collective); ``finish_log(loop)``
    writes the log step still pending (its losses belong in the checkpoint)."""

    def __init__(self, cfg: Config, ctx: Context, checkpoints: CheckpointManager, *, phase: Phase,
                 save: Callable[[Loop, bool], None], finish_log: Callable[[Loop], None]) -> None:
        self.cfg, self.ctx, self.checkpoints, self.phase = cfg, ctx, checkpoints, phase
        self.save, self.finish_log = save, finish_log
        self.vote: StopAgreement | None = None
        self.stopped: StopRecord | None = None  # a stop the ranks agreed on: its step, signal, checkpoint

    @contextlib.contextmanager
    def taking_stops(self) -> Iterator[StopAgreement]:
        """While the loop runs: a stop signal is a request the ranks vote on at step boundaries (:attr:`vote`)."""
        ctx = self.ctx
        self.vote = StopAgreement(ctx.device, enabled=bool(self.cfg.checkpoint.get("on_stop", True)),
                                  request_file=os.path.join(ctx.local_dir, layout.STOP_REQUEST)
                                  if ctx.is_main else None)
        signals.accept_stops(True)
        try:
            yield self.vote
        finally:
            signals.accept_stops(False)

    def stop(self, loop: Loop, state: TrainState, signum: int, *, saved: bool, during: str | None = None,
             final: bool = False) -> None:
        """Every rank agreed to stop after this step: one complete checkpoint of it (unless one is saved or being
        saved already: the periodic or the final one, which this waits for), committed before the process ends.
        ``during``: the work the stop cut short (a validation), for the record; ``final``: the step is the last."""
        signals.taken()
        if loop.pending is not None:
            self.finish_log(loop)  # the checkpoint holds the losses
        t0 = time.monotonic()
        with self.phase("checkpoint"):
            if not saved:
                self.save(loop, final)
            self.checkpoints.wait()
        signals.done()  # committed: the process ends by itself from here
        name = f"step_{state.step}"
        self.stopped = StopRecord(step=state.step, signal=signum, checkpoint=name,
                                  save_s=round(time.monotonic() - t0, 3),
                                  signal_after_step=signals.requested_after(), during=during, last_step=final)
        print(f"stop: signal {signum}: every rank stopped after step {state.step}"
              + (f", during {during}" if during else "")
              + f"; checkpoint {name} committed in {time.monotonic() - t0:.2f} s", flush=True)

    def end(self, loop: Loop, state: TrainState, validator: Validator) -> None:
        """After the last optimizer step: the final checkpoint first, then the final validation, so that a stop from
        here on loses no step. A stop during the validation (the ranks vote after each of its batches) cuts it short,
        and the run ends stopped at its last step, which ``resume=<run dir>`` validates (docs/resume.md); a stop
        after both cuts nothing, and the run completes."""
        saved = self.holds_this_step(loop, state)  # resumed at its last step: a stop had cut its final validation
        if not saved:
            with self.phase("checkpoint"):  # in the background where saves are: it overlaps the validation
                saved = self.checkpoint_final(loop)
        signum = loop.stop_agreed  # the last step's vote
        if validator.enabled:
            try:
                if not signum:
                    validator.run(loop.writer, state.step, loop.progress, self.vote)
            except StopAgreed as agreed:  # every rank left the validation at the same batch
                signum = agreed.signum
            if signum:
                self.stop(loop, state, signum, saved=saved, during="the final validation", final=True)
                return
        with self.phase("checkpoint"):
            self.checkpoints.wait()
        if saved:
            signals.done()  # every step is committed: a stop from here on cuts nothing

    def holds_this_step(self, loop: Loop, state: TrainState) -> bool:
        """Did this launch resume from this run's own checkpoint of the step it is at, and make no step since (a
        continued run whose final validation a stop had cut short: that checkpoint is its final one)?"""
        resumed = self.checkpoints.resumed_from
        own = layout.join(self.checkpoints.root, f"step_{state.step}")
        return resumed is not None and state.step == loop.start_step and resumed.rstrip("/") == own.rstrip("/")

    def checkpoint_final(self, loop: Loop) -> bool:
        """The final checkpoint (collective), with the open logging window's losses (none at the last step), written
        in the background where saves are (``checkpoints.wait()`` waits for it); False when none is due
        (``checkpoint.final=false``)."""
        if not self.checkpoints.final:
            return False
        signals.taken()  # a stop from here on waits for this save: it holds every step
        self.save(loop, True)
        return True
