"""Checkpoint policy for one run on this rank: what a checkpoint holds, when one is due, where a run resumes
from, and whether it can (in the spirit of torchtitan's ``CheckpointManager``).

- What: the strategy's model and optimizer state, then the scheduler, the gradient scaler, the progress
  (step, epoch, the sampler's position as micro-batches of the epoch, the logged losses), every rank's RNG state,
  the plan and the config.
- When: every ``checkpoint.every_steps`` (not at the last step, which the final checkpoint covers), at the end
  unless ``checkpoint.final=false``, and on a stop the write in flight is finished (``stop.signals``).
- From where: the run's own newest complete checkpoint, whatever ``resume`` says; else the source ``resume``
  names. A candidate that fails its integrity check is passed over for the next older one, unless it was named
  explicitly.
- Whether: ``compat.check`` (layout, model keys, the world-size/global-batch rule, the data position).

The trainer asks; storage (``storage``, ``sharded``, ``async_saver``) writes and reads.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import IO, Any, Protocol

import torch
import torch.distributed as dist

from ddp_runner.contract import checkpoints, layout, secrets
from ddp_runner.tasks.engine.checkpoint import compat, sharded, storage
from ddp_runner.tasks.engine.checkpoint.async_saver import AsyncSaver
from ddp_runner.tasks.engine.checkpoint.rng import rng_state, set_rng_state
from ddp_runner.tasks.engine.config import BatchPlan, Config
from ddp_runner.tasks.engine.diagnostics import faults, heartbeat
from ddp_runner.tasks.engine.stop import signals
from ddp_runner.tasks.engine.strategy.base import Strategy
from ddp_runner.tasks.engine.train_state import TrainState


class MicroBatchFit(Protocol):
    """``batch.per_rank=auto``'s side of a checkpoint (tasks/engine/micro_fit.py's ``MicroFit``)."""

    def resumed(self, their_plan: dict[str, Any], their_record: dict[str, Any] | None) -> None:
        """A resume from a checkpoint with this plan and ``micro_batch`` record (None: it has none)."""

    def record(self) -> dict[str, Any] | None:
        """What a checkpoint records as ``micro_batch`` (None: nothing)."""


@dataclass(frozen=True)
class Sources:
    """Checkpoints to resume from, newest first; ``explicit``: the one candidate was named (its failure is the
    answer, no fallback)."""

    urls: list[str]
    explicit: bool = False


def resume_sources(resume: str, ckpt_root: str) -> Sources:
    """Where a run whose checkpoints live under ``ckpt_root`` resumes from, given ``resume``.

    A run's own checkpoints always win, whatever ``resume`` says: they are this run's progress (an elastic
    restart of a ``resume=never`` run must not start over and then have keep_last delete its fresh checkpoints
    as "older" than the previous attempt's). ``resume`` says where a run with none starts: ``auto``/``never``
    (and ``restart``) nowhere, a checkpoint that one, a run directory (or its ``checkpoints/``) its complete ones.
    """
    own = [url for _, url in reversed(storage.list_complete(ckpt_root))]
    if own or resume in ("auto", "never", "restart"):
        return Sources(own)
    if storage.is_checkpoint(resume):
        return Sources([resume], explicit=True)
    found = storage.list_complete(resume) or storage.list_complete(layout.join(resume, layout.CHECKPOINTS))
    if not found:
        raise ValueError(f"resume={resume!r}: no complete checkpoint there. Fix: point resume at a"
                         " run directory with checkpoints/step_<N>, a checkpoint, or use resume=never")
    return Sources([url for _, url in reversed(found)])


def save_due(step: int, total_steps: int, every_steps: int | None) -> bool:
    """Whether optimizer step ``step`` ends with a periodic checkpoint (the last step has the final one)."""
    return bool(every_steps) and step % every_steps == 0 and step != total_steps


def restored_progress(state: dict[str, Any], plan: BatchPlan) -> TrainState:
    """The progress a checkpoint's ``state`` continues from on this run's ``plan``: the data position is
    counted in micro-batches of the checkpoint's per-rank batch, converted to this run's."""
    p = state["progress"]
    samples = compat.samples_done(state, plan) // plan.world_size
    state_ = TrainState(p["step"], p["epoch"], samples // plan.per_rank, list(p.get("losses", [])))
    if state.get("plan") == plan.as_dict() and p.get("logged_step") is not None:  # the same ranks and steps
        state_.window_loss, state_.logged_step = list(p.get("window_loss") or []), p["logged_step"]
    return state_


def _name(url: str) -> str:
    return url.rstrip("/").rsplit("/", 1)[-1]


class CheckpointManager:
    """This rank's checkpoints: saves what is due and resumes from the right source (see the module docstring).

    ``optimizer``, ``scheduler`` and ``scaler`` are the engine's (the optimizer already wrapped by the strategy);
    the model's and optimizer's state go through ``strategy``.
    """

    def __init__(self, cfg: Config, *, run_dir: str, rank: int, console: IO[str] | None, plan: BatchPlan,
                 strategy: Strategy, optimizer: torch.optim.Optimizer, scheduler: Any,
                 scaler: torch.amp.GradScaler | None) -> None:
        c = cfg.checkpoint
        self.cfg, self.rank, self.console, self.plan = cfg, rank, console, plan
        self.strategy, self.optimizer, self.scheduler, self.scaler = strategy, optimizer, scheduler, scaler
        self.root, self.run_dir = layout.join(run_dir, layout.CHECKPOINTS), run_dir
        self.export_format = c.get("export")  # also export the weights at every checkpoint (ddp-export's formats)
        self.every_steps, self.keep_last, self.final = c.every_steps, c.keep_last, bool(c.get("final", True))
        self.resumed_from: str | None = None
        # batch.per_rank=auto (tasks/engine/micro_fit.py): a checkpoint records the fitted micro-batch, and a resume
        # tells it the checkpoint's plan and record before it checks and counts in this run's; None: a given one.
        self.micro_fit: MicroBatchFit | None = None
        self._hooks = faults.save_hooks()  # the tests' hold before a commit; None in a real run
        self._first_commit_unix: float | None = None
        # Background saving snapshots rank 0's whole state; a strategy whose state is spread saves collectively.
        self.saver = AsyncSaver(self._hooks) if (rank == 0 and c.async_save and strategy.full_state_on_rank0) \
            else None
        if self.saver is not None:  # stopped by SIGTERM (a peer failed, or Ctrl-C): finish the write in flight
            signals.on_terminate(self.saver.finish)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def first_commit_unix(self) -> float | None:
        """When this launch's first checkpoint was committed (None: none yet)."""
        return self.saver.first_commit_unix if self.saver is not None else self._first_commit_unix

    def due(self, step: int, last: int) -> bool:
        """Whether optimizer step ``step`` ends with a periodic checkpoint (``last``: the run's last step, which has
        the final one instead)."""
        return save_due(step, last, self.every_steps)

    # -- resume ----------------------------------------------------------------------------------------------

    def maybe_resume(self) -> TrainState | None:
        """Load model, optimizer, scheduler, scaler and this rank's RNG state from the checkpoint to resume
        from, and return its progress; None when there is none (a fresh start).

        A candidate that fails its integrity check (size or sha256 against meta.json) is passed over for the
        next older complete one, and the log says so; a checkpoint named explicitly is not.
        """
        sources = resume_sources(str(self.cfg.resume), self.root)
        if not sources.urls:
            return None
        state, src = self._load(sources)
        if self.micro_fit is not None:
            self.micro_fit.resumed(state.get("plan", {}), state.get("micro_batch"))
        model_shapes = {k: tuple(v.shape) for k, v in self.strategy.model.state_dict().items()}
        compat.check(state, src, self.plan, model_shapes, run_sharded=self.strategy.sharded_checkpoint,
                     strategy_name=(self.cfg.get("strategy") or {}).get("name", "ddp"))
        if sharded.is_sharded(state):  # model and optimizer state come from every rank's shards
            shards = self.strategy.state_dict(self.optimizer)
            sharded.load_shards(src, state, shards)
            state = {**state, **shards}
        self.strategy.load_state_dict(state, self.optimizer)
        self.scheduler.load_state_dict(state["scheduler"])
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        progress = restored_progress(state, self.plan)
        if self.rank < len(state["rng"]):  # a rank the checkpoint did not have keeps its own seeded stream
            set_rng_state(state["rng"][self.rank])
        self.resumed_from = src
        print(f"resumed from {src} at step {progress.step}", flush=True)
        if self.is_main and self.console is not None:  # the user's console says it, not only the rank log
            run = src.rstrip("/").rsplit("/", 2)[0]
            promise = compat.exactness(state.get("plan", {}), self.plan, self._device_type(),
                                       torch.are_deterministic_algorithms_enabled())
            print(f"ddp-run: resumed from step {progress.step} of {run} (checkpoint {_name(src)}); {promise}",
                  file=self.console, flush=True)
        return progress

    def _device_type(self) -> str:
        """Where the model's parameters live (``cpu``, ``cuda``)."""
        return next(iter(self.strategy.model.parameters()), torch.empty(0)).device.type

    def _load(self, sources: Sources) -> tuple[dict[str, Any], str]:
        """The first candidate that loads, and its URL; rank 0 says which were passed over, and why."""
        if sources.explicit:
            return storage.load(sources.urls[0], map_location="cpu"), sources.urls[0]
        state, src, skipped = storage.load_first_good(sources.urls, map_location="cpu")
        for url, reason in skipped:
            if self.is_main:  # every rank makes the same choice from the same files; rank 0 says it
                msg = checkpoints.fallback_warning(_name(url), reason, _name(src))
                print(msg, flush=True)  # the rank log
                if self.console is not None:  # and the user's console: a checkpoint was passed over
                    print(f"warning: {msg}", file=self.console, flush=True)
        return state, src

    # -- save ------------------------------------------------------------------------------------------------

    def save(self, progress: TrainState, *, final: bool = False) -> None:
        """Every rank hands its RNG state to rank 0 (one collective), which saves atomically. A strategy whose
        state is spread over the ranks gathers it first (zero1) or has every rank write its shards (fsdp)."""
        heartbeat.phase("checkpoint")
        rng: list[Any] = [None] * self.plan.world_size
        dist.all_gather_object(rng, rng_state())
        spread = not self.strategy.full_state_on_rank0
        model_optim = self.strategy.state_dict(self.optimizer) if spread else None  # collective
        if self.strategy.sharded_checkpoint:
            self._save_sharded(progress, rng, model_optim, final)
            self._export(progress)
            return
        if not self.is_main:
            return
        state = {**(model_optim or self.strategy.state_dict(self.optimizer)), **self._small_state(progress, rng)}
        self._export(progress, state["model"])
        if self.saver is not None:
            self.saver.save(self.root, progress.step, state, keep_last=self.keep_last, protect=self._protected())
        else:
            storage.save(self.root, progress.step, state, keep_last=self.keep_last, protect=self._protected(),
                         hooks=self._hooks)
            self._committed()

    def save_final(self, progress: TrainState) -> None:
        """The checkpoint at the end of training (unless ``checkpoint.final=false``), and the wait for any write
        still in flight."""
        if self.final:  # off only for benchmarks of models too big to save often
            self.save(progress, final=True)
        if self.saver is not None:
            self.saver.wait()

    def wait(self) -> None:
        """Until the checkpoint being written in the background (if any) is committed."""
        if self.saver is not None:
            self.saver.wait()

    def _save_sharded(self, progress: TrainState, rng: list[Any], shards: dict[str, Any] | None,
                      final: bool) -> None:
        """Every rank writes its shards; rank 0 commits (the last checkpoint also gets a consolidated model)."""
        sharded.save(self.root, progress.step, self._small_state(progress, rng) if self.is_main else {}, shards,
                     keep_last=self.keep_last, protect=self._protected(),
                     export=self.strategy.model if final else None, hooks=self._hooks)
        self._committed()

    def _export(self, progress: TrainState, model_state: dict[str, Any] | None = None) -> None:
        """``checkpoint.export``: this checkpoint's weights into ``<run>/export/step_<N>`` too (ddp-export's files).
        ``model_state``: rank 0's whole model state; None: a sharded model, gathered here (collective)."""
        if not self.export_format:
            return
        if model_state is None:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

            model_state = get_model_state_dict(self.strategy.model,
                                               options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if not self.is_main:
            return
        from ddp_runner.tasks.engine.checkpoint import export

        small = {"progress": progress.state_dict(), "plan": self.plan.as_dict(), "config": self.cfg.to_yaml()}
        out = export.default_dir(self.run_dir, progress.step, str(self.export_format))
        export.write(export.clean_names(model_state), small, out, str(self.export_format),
                     data_path=(self.cfg.get("data") or {}).get("path"))

    def _small_state(self, progress: TrainState, rng: list[Any]) -> dict[str, Any]:
        """Everything in a checkpoint but model and optimizer state."""
        fitted = self.micro_fit.record() if self.micro_fit is not None else None
        return {
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "progress": progress.state_dict(),
            "rng": rng,
            "plan": self.plan.as_dict(),
            "config": secrets.redact(self.cfg.to_yaml(), secrets.handed_over()),  # a record: no secret in it
            **({"micro_batch": fitted} if fitted is not None else {}),  # auto: how the plan's micro-batch was found
        }

    def _protected(self) -> frozenset[str]:
        """Never deleted by keep_last: the checkpoint this run resumed from."""
        return frozenset({self.resumed_from} if self.resumed_from else ())

    def _committed(self) -> None:
        if self._first_commit_unix is None:
            self._first_commit_unix = time.time()

    # -- lifetime --------------------------------------------------------------------------------------------

    def reserve(self) -> None:
        """Once the optimizer state exists: get the background save's host buffers ready."""
        if self.saver is not None:
            self.saver.reserve(self.strategy.state_dict(self.optimizer))

    def close(self) -> None:
        """Finish the write in flight (re-raising its error) and free the background save's buffers."""
        if self.saver is not None:
            signals.forget(self.saver.finish)
            self.saver.close()
