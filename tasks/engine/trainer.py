"""The one training engine: set-up, then the loop as named steps (micro-step, optimizer step, log, validate,
checkpoint). Every task supplies model, data and loss (``ddp_runner.tasks.api.TaskParts``); the parallel strategy
(``strategy/``) wraps the model; this module owns the order of things.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import math
import os
import socket
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from typing import IO, Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, Subset

from ddp_runner.contract import layout, rules, series, stops
from ddp_runner.tasks import registry
from ddp_runner.tasks.api import TaskParts
from ddp_runner.tasks.engine import compile_cache, metrics, startup, task_metrics, timing, val_compile, worker_io
from ddp_runner.tasks.engine import logging as tb
from ddp_runner.tasks.engine import progress as console_progress
from ddp_runner.tasks.engine.checkpoint.manager import CheckpointManager
from ddp_runner.tasks.engine.config import Config, batch_plan, load_config
from ddp_runner.tasks.engine.diagnostics import faults, heartbeat, profiling, termination
from ddp_runner.tasks.engine.diagnostics import telemetry as gpu_telemetry
from ddp_runner.tasks.engine.optim import apply_inductor_settings, build_optimizer, lr_factor
from ddp_runner.tasks.engine.progress import Progress
from ddp_runner.tasks.engine.sampler import ResumableDistributedSampler
from ddp_runner.tasks.engine.scaling_facts import entry as scaling_facts
from ddp_runner.tasks.engine.stop import StopAgreed, StopAgreement
from ddp_runner.tasks.engine.strategy import factory, grad_sync
from ddp_runner.tasks.engine.strategy.base import Strategy
from ddp_runner.tasks.engine.trackers.base import Trackers
from ddp_runner.tasks.engine.trackers.open import open_trackers
from ddp_runner.tasks.engine.trackers.tensorboard import TensorBoard
from ddp_runner.tasks.engine.train_state import TrainState

AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class Context:
    """Who and where this rank is."""

    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    run_dir: str
    local_dir: str
    console: IO[str] | None
    device_name: str = "cpu"

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def setup(run_dir: str, local_dir: str, console: IO[str] | None, cfg: Config) -> Context:
    """Pick this rank's device (local rank indexes the visible devices) and join the process group."""
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    if cfg.train.get("deterministic"):
        deterministic_kernels()
    if cfg.device == "cuda":
        index = local_rank
        own = own_gpu(os.environ.get("CUDA_VISIBLE_DEVICES"), local_rank)
        if own is not None and cfg.train.get("own_gpu", True) and not torch.cuda.is_initialized():
            os.environ["CUDA_VISIBLE_DEVICES"], index = own, 0
        torch.cuda.set_device(index)
        cap, _ = rules.asked_cap_gb(cfg)
        fraction = memory_fraction(cap, torch.cuda.get_device_properties(index).total_memory)
        if fraction is not None:  # hold the run to the memory its plan was checked against
            torch.cuda.set_per_process_memory_fraction(fraction, index)
        torch.backends.cuda.matmul.allow_tf32 = True  # fp32 matmuls outside autocast use tensor cores
        torch.backends.cudnn.allow_tf32 = True
        device = torch.device("cuda", index)
        name = torch.cuda.get_device_name(device)
    else:
        device, name = torch.device("cpu"), "cpu"
    dist.init_process_group(
        cfg.backend, timeout=timedelta(seconds=cfg.timeout_s),
        device_id=device if device.type == "cuda" else None,
    )
    return Context(rank, local_rank, world_size, device, run_dir, local_dir, console, name)


def deterministic_kernels() -> None:
    """train.deterministic: every kernel deterministic (an op without a deterministic kernel raises, naming
    itself), so that the same plan gives the same bits on CUDA as on the CPU. Before CUDA is used: cuBLAS reads its
    workspace setting when it creates its handle."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    import torch._inductor.config as inductor_config

    if hasattr(inductor_config, "deterministic"):  # no on-device benchmarking that picks kernels of other numerics
        inductor_config.deterministic = True


def memory_fraction(cap_gb: float | None, total_bytes: int) -> float | None:
    """The fraction of a device of ``total_bytes`` that a cap of ``cap_gb`` GiB allows this process (for
    ``torch.cuda.set_per_process_memory_fraction``), so that a run allowed under a cap cannot use more than it:
    over it the allocator raises its out-of-memory error. None: no cap, or one at least the device's size."""
    if cap_gb is None or total_bytes <= 0 or cap_gb * 2**30 >= total_bytes:
        return None
    return cap_gb * 2**30 / total_bytes


def own_gpu(visible: str | None, local_rank: int) -> str | None:
    """The ``CUDA_VISIBLE_DEVICES`` under which local rank ``local_rank`` sees only its own GPU, as ``cuda:0`` (None:
    leave it as it is). Every rank then compiles for ``cuda:0``, and a rank other than 0 finds in the shared compile
    cache what a 1-GPU job or rank 0 compiled: inductor's cache keys hold the device index. The same mapping as
    torchrun's ``--virtual-local-rank``; the k-th visible device stays local rank k's."""
    if visible is None:
        return str(local_rank)
    entries = [e.strip() for e in visible.split(",")]
    if not visible.strip() or local_rank >= len(entries) or not entries[local_rank]:
        return None  # no GPU to narrow to: CUDA reports it as it would have
    return entries[local_rank]


def _node() -> str:
    """This rank's node: the name its driver gave it (multi-node runs), its Slurm node index, else torchrun's group
    rank."""
    return os.environ.get(layout.ENV_NODE) or os.environ.get("SLURM_NODEID") or os.environ.get("GROUP_RANK", "0")


def _device_label(ctx: Context) -> str:
    label = f"{ctx.device.type}:{ctx.local_rank}"
    if os.environ.get("LOCAL_WORLD_SIZE", "1") != os.environ.get("WORLD_SIZE", "1"):  # several nodes
        return f"node{_node()}/{label}"
    return label


def _facts(ctx: Context, **extra: Any) -> dict[str, Any]:
    facts: dict[str, Any] = {
        "rank": ctx.rank, "local_rank": ctx.local_rank, "host": socket.gethostname(), "pid": os.getpid(),
        "node": _node(),
        "device": _device_label(ctx), "device_name": ctx.device_name,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        # Where this job's ranks met and ran (a concurrent sweep's jobs each have their own; sweep.json shows them).
        "master_port": os.environ.get("MASTER_PORT"),
        "cpu_affinity": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "torch": torch.__version__, "backend": dist.get_backend() if dist.is_initialized() else None,
        "restart_count": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
        # The world this rank ran in, and when it said so: the driver tells this launch's files from an earlier
        # attempt's (an elastic job restarted on fewer nodes leaves the higher ranks' files behind).
        "world_size": ctx.world_size, "written": time.time(),
    }
    if ctx.device.type == "cuda":
        facts["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        facts["cuda"] = torch.version.cuda
        get_fraction = getattr(torch.cuda, "get_per_process_memory_fraction", None)
        if get_fraction is not None:
            facts["memory_fraction"] = get_fraction(ctx.device)
    facts.update(extra)
    return facts


@torch.no_grad()
def evaluate(model: torch.nn.Module, data: Dataset, ctx: Context, batch: int, precision: str,
             lockstep: bool = False, metrics: dict[str, float] | None = None,
             names: tuple[str, ...] | None = None, compile_mode: str = "compiled",
             stop: Callable[[], int] | None = None) -> float:
    """Mean loss over the whole dataset, each sample counted exactly once across ranks.

    ``metrics``: filled with the task's extra metrics (``names``, the same on every rank) over the same samples,
    each batch weighted by its size, reduced in the loss's own all-reduce.

    DistributedSampler pads uneven splits with duplicates; here rank r takes samples r, r+W, r+2W, … with
    no padding, and the sums and counts are reduced across ranks. ``lockstep``: every forward is a collective
    (a sharded model gathers its parameters), so a rank with fewer batches runs extra forwards that count zero.
    ``compile_mode``: ``eager`` or ``compiled``, how a compiled model runs here (tasks/engine/val_compile.py).
    ``stop``: the stop vote (a collective), taken after every batch, as many times on every rank (rank 0's batch
    count, the largest); a stop it agrees on leaves the validation on every rank at that batch (``StopAgreed``).
    """
    was_training = model.training
    model.eval()
    shard = Subset(data, range(ctx.rank, len(data), ctx.world_size))
    totals = torch.zeros(2, dtype=torch.float64, device=ctx.device)
    sums = task_metrics.Sums(ctx.device, names if metrics is not None else ())
    most = math.ceil(math.ceil(len(data) / ctx.world_size) / batch)  # rank 0's batch count, the largest
    batches = iter(DataLoader(shard, batch_size=batch, shuffle=False))
    filler = next(iter(DataLoader(data, batch_size=1))) if lockstep else None
    try:
        for i in range(most):
            xy = next(batches, None)
            if xy is not None or lockstep:  # a rank out of batches runs the lockstep's forwards, counting zero
                x, y = xy if xy is not None else filler
                if compile_mode == "compiled":  # CUDA graphs (reduce-overhead): each batch is a new step of the tree
                    val_compile.mark_step()
                with val_compile.stance(compile_mode, first_batch=i == 0), _autocast(ctx.device, precision):
                    loss, extra = task_metrics.split_output(model(x.to(ctx.device), y.to(ctx.device)))
            if xy is not None:
                totals[0] += loss.double() * len(x)
                totals[1] += len(x)
                sums.add({k: v for k, v in extra.items() if k in (sums.names or ())}, weight=len(x))
                heartbeat.tick()
            if stop is not None and (signum := stop()):
                raise StopAgreed(signum)
        totals = torch.cat([totals, sums.sums.double()])
        dist.all_reduce(totals)
    finally:
        model.train(was_training)
    if metrics is not None:
        metrics.update(zip(sums.names or (), (totals[2:] / totals[1]).tolist(), strict=True))
    return (totals[0] / totals[1]).item()


def window_ends(start_step: int, last_step: int, log_every: int) -> list[int]:
    """The optimizer step that ends each logging window of a launch that began after ``start_step`` and ended at
    ``last_step``: every multiple of ``log_every``, and the last step."""
    ends = list(range((start_step // log_every + 1) * log_every, last_step + 1, log_every))
    return ends if ends and ends[-1] == last_step else [*ends, last_step]


def _autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    dtype = AUTOCAST_DTYPES.get(precision)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


@dataclass
class _Loop:
    """What the loop carries from one optimizer step to the next."""

    meter: metrics.StepMeter
    profiler: profiling.StepProfiler
    writer: Any
    progress: Progress | None
    loss_sum: torch.Tensor          # sum of micro-step losses since the last log step (on the device)
    logged_step: int
    extras: task_metrics.Sums       # the task's extra metrics since the last log step (tasks/api.py)
    pending: tb.PendingLog | None = None
    window_end: Any = None              # the pending log step's window boundary (StepMeter.boundary)
    last: dict[str, float] = field(default_factory=dict)
    val_loss: float | None = None
    val_metrics: dict[str, float] = field(default_factory=dict)  # the last validation's extra metrics
    stop_agreed: int = 0                # a stop every rank voted for in a log step's gather (its signal)
    first_step_s: float | None = None   # from the driver's start to the end of this launch's first step
    start_step: int = 0                 # optimizer steps done before this launch (a resume)
    start_unix: float = 0.0             # when this launch's first step began
    first_step_end_unix: float | None = None
    # Where each step's time goes on this rank (tasks/engine/timing.py); off unless the loop sets one up.
    timer: timing.PhaseTimer = field(default_factory=lambda: timing.PhaseTimer(torch.device("cpu"), 0, 0))


class Trainer:
    """One run of the training loop on this rank."""

    def __init__(self, cfg: Config, ctx: Context, writer_future: Future | None = None) -> None:
        self.cfg, self.ctx = cfg, ctx
        self.writer_future = writer_future
        t = cfg.train
        torch.manual_seed(cfg.seed)  # same init on every rank (DDP also broadcasts rank 0's weights)
        self.parts: TaskParts = registry.build(cfg, ctx.device)
        self.model = self.parts.model.to(ctx.device)
        # Same weights everywhere, but each rank its own random stream from here on (dropout masks must
        # differ across ranks that see different data). A resume restores every rank's saved stream.
        torch.manual_seed(cfg.seed + ctx.rank)
        if t.compile and t.get("inductor"):
            apply_inductor_settings(t.inductor)
        # Before anything compiles: jobs and reruns under one output root share what was compiled.
        self.compile_cache = (compile_cache.configure(str(cfg.output.root))
                              if t.compile and t.get("compile_cache", True) else None)
        self.strategy: Strategy = factory.build(cfg, self.model, ctx.device, ctx.local_rank, ctx.world_size)
        # zero1 partitions the optimizer state over the ranks; the others step the optimizer as it is.
        self.optimizer = self.strategy.wrap_optimizer(build_optimizer(t, self.strategy.params))
        self.scaler = torch.amp.GradScaler(ctx.device.type) if t.precision == "fp16" else None
        self.plan = batch_plan(cfg, ctx.world_size)
        self.per_rank, self.accumulation = self.plan.per_rank, self.plan.accumulation
        self._build_data()
        self.state = TrainState()
        self.total_steps = self._total_steps()
        # How validation runs the compiled model, and what each validation cost (summary.json "validation").
        self.validation: dict[str, Any] = {
            "compile_mode": val_compile.resolve(t.get("val_compile"), t.val_every, self.total_steps),
            "runs": 0, "seconds": 0.0, "last_s": None, "graphs_compiled": 0}
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer,
            lambda s: lr_factor(s, self.total_steps, t.schedule, t.warmup_steps, t.min_lr_ratio),
        )
        self.checkpoints = CheckpointManager(
            cfg, run_dir=ctx.run_dir, rank=ctx.rank, console=ctx.console, plan=self.plan, strategy=self.strategy,
            optimizer=self.optimizer, scheduler=self.scheduler, scaler=self.scaler)
        # Clock, power, temperature and power-cap state of this rank's GPU, per logging window (None: no NVML).
        self.telemetry = gpu_telemetry.Sampler.start(ctx.device) if t.get("gpu_telemetry", True) else None
        self.gpu_windows: dict[int, list[dict[str, float]]] = {}
        self.time_windows: dict[int, list[dict[str, float]]] = {}  # each rank's phase times, per logging window
        self.extras: task_metrics.Sums | None = None  # the loop's extra metric sums (names known after a forward)
        self.stopped: dict[str, Any] | None = None  # a stop the ranks agreed on: its step, signal, checkpoint
        self.stop_vote: StopAgreement | None = None

    def _build_data(self) -> None:
        """The sampler, the loader and the optimizer steps an epoch gives."""
        cfg, ctx, t = self.cfg, self.ctx, self.cfg.train
        # shuffle=True here, never in the DataLoader: the sampler shuffles by (seed, epoch) identically on every
        # rank and hands each rank its own slice.
        self.sampler = ResumableDistributedSampler(
            self.parts.train_set, num_replicas=ctx.world_size, rank=ctx.rank, shuffle=True, seed=cfg.seed,
        )
        # drop_last keeps every micro-batch exactly batch.per_rank, so the global batch is what the plan says.
        # The loader draws its workers' base seed at every iter() from a generator of its own, seeded per epoch
        # (_micro_batches): from the global RNG, that draw would put a resumed run's dropout one number behind.
        self.loader_rng = torch.Generator()
        self.loader = DataLoader(
            self.parts.train_set, batch_size=self.per_rank, sampler=self.sampler, drop_last=True,
            num_workers=t.num_workers, pin_memory=ctx.device.type == "cuda",
            persistent_workers=t.num_workers > 0, worker_init_fn=termination.shield_loader_worker,
            generator=self.loader_rng,
        )
        self.steps_per_epoch = (self.sampler.num_samples // self.per_rank) // self.accumulation
        if self.steps_per_epoch == 0:
            raise ValueError(
                f"batch.accumulation={self.accumulation}: an epoch gives each rank only"
                f" {self.sampler.num_samples // self.per_rank} micro-batches, fewer than one optimizer step."
                " Fix: lower batch.accumulation, batch.per_rank or world_size, or use more data"
            )

    # -- checkpoints: the manager decides, the trainer asks ---------------------------------------------

    @property
    def resumed_from(self) -> str | None:
        """The checkpoint this launch resumed from (None: a fresh start)."""
        return self.checkpoints.resumed_from

    def maybe_resume(self) -> None:
        """Continue from the checkpoint the manager picks, if any: its progress, and the steps left from there."""
        resumed = self.checkpoints.maybe_resume()
        if resumed is not None:
            self.state = resumed
            self.total_steps = self._total_steps()
            t = self.cfg.train
            self.validation["compile_mode"] = val_compile.resolve(t.get("val_compile"), t.val_every, self.total_steps)

    def checkpoint(self, final: bool = False, loop: _Loop | None = None) -> None:
        """Save a checkpoint of where training stands now (collective: every rank calls it); with ``loop``, the
        losses of the logging window still open too, so that a resume logs exactly what an uninterrupted run would."""
        if loop is not None:
            self._keep_window(loop)
            if loop.writer is not None:  # what this checkpoint covers is in the trackers: a resume leaves no gap
                loop.writer.flush()
        self.checkpoints.save(self.state, final=final)

    def _keep_window(self, loop: _Loop) -> None:
        """Every rank's open logging window (its loss sum differs per rank) into the progress (one collective)."""
        sums: list[Any] = [None] * self.ctx.world_size
        dist.all_gather_object(sums, float(loop.loss_sum))
        self.state.window_loss, self.state.logged_step = sums, loop.logged_step

    def _total_steps(self) -> int:
        """``train.max_steps``, or the steps done plus what is left of ``train.epochs`` from where training stands.

        Counted from the current position, not as epochs × steps per epoch: a run resumed from a checkpoint whose
        steps had another size (another per-rank batch or accumulation) still finishes exactly the epochs asked for.
        """
        t, s = self.cfg.train, self.state
        if t.max_steps:
            return t.max_steps
        left = (t.epochs - s.epoch) * self.steps_per_epoch * self.accumulation - s.micro_in_epoch
        return s.step + max(0, left) // self.accumulation

    # -- the loop --------------------------------------------------------------------------------------

    def _say(self, msg: str) -> None:
        print(msg, flush=True)

    def _micro_batches(self):
        """Yield (x, y, data_wait_s) forever, epoch after epoch, calling set_epoch every epoch."""
        while True:
            self.sampler.set_epoch(self.state.epoch)
            self.sampler.set_start(self.state.micro_in_epoch * self.per_rank)
            usable = self.steps_per_epoch * self.accumulation
            self.loader_rng.manual_seed(self.cfg.seed + self.state.epoch)
            it = iter(self.loader)
            while self.state.micro_in_epoch < usable:
                t0 = time.perf_counter()
                x, y = next(it)
                yield x, y, time.perf_counter() - t0
            self.state.epoch += 1
            self.state.micro_in_epoch = 0

    def train(self) -> dict[str, Any]:
        """Run optimizer steps to ``total_steps`` (or to an agreed stop), then checkpoint and validate once more;
        return the summary."""
        batches = self._micro_batches()
        if self.resumed_from is not None and self.state.step < self.total_steps:  # no step left: it only validates
            batches = self._settle_buckets(batches)
        loop = self._start_loop()
        stop = self.stop_vote = StopAgreement(self.ctx.device, enabled=bool(self.cfg.checkpoint.get("on_stop", True)),
                             request_file=os.path.join(self.ctx.local_dir, layout.STOP_REQUEST)
                             if self.ctx.is_main else None)
        termination.accept_stops(True)
        try:
            self._loop(loop, batches, stop)
            loop.profiler.finish(self.state.step)  # when training ended inside the traced steps
            if self.stopped is None:
                self._end(loop, stop)
        finally:
            termination.accept_stops(False)
        return self._finish(loop)

    def _settle_buckets(self, batches: Iterator[Any]) -> Iterator[Any]:
        """A resumed launch reduces its gradients in the buckets an uninterrupted run has at that step (the
        strategy's ``settle_buckets`` says why): a throw-away forward and backward of the next micro-batch, with
        this rank's RNG as it was after it. Returns the micro-batches, that one still first."""
        first = next(batches)
        x, y = (t.to(self.ctx.device, non_blocking=True) for t in first[:2])

        def sync_step() -> None:
            heartbeat.phase("sync")
            if self.strategy.cudagraphs:
                torch.compiler.cudagraph_mark_step_begin()
            with self.strategy.sync(True):
                with _autocast(self.ctx.device, self.cfg.train.precision):
                    loss, _ = task_metrics.split_output(self.strategy.forward(True)(x, y))
                self.strategy.backward(loss.float() * 0.0, first=True, last=True)

        cuda = [self.ctx.device.index or 0] if self.ctx.device.type == "cuda" else []
        with torch.random.fork_rng(devices=cuda, device_type="cuda"):
            if self.strategy.settle_buckets(sync_step) and self.ctx.is_main:
                self._say("resume: one throw-away forward and backward laid out the gradient buckets as the"
                          " uninterrupted run has them")
        return itertools.chain([first], batches)

    def _loop(self, loop: _Loop, batches: Any, stop: StopAgreement) -> None:
        """Optimizer steps to ``total_steps``, or to the step boundary where the ranks agree to stop."""
        t = self.cfg.train
        while self.state.step < self.total_steps:
            # Where the profiler starts or stops, the pause drains the device before its clock starts: the
            # profiler's own drain would otherwise count the queued training work as the pause's time.
            with loop.meter.paused("profile", sync=loop.profiler.acts_before(self.state.step + 1)):
                loop.profiler.before_step(self.state.step + 1)
            loop.timer.begin_step(self.state.step + 1)
            for m in range(self.accumulation):
                self.micro_step(batches, loop, first=m == 0, last=m == self.accumulation - 1)
            heartbeat.phase("optimizer")
            lr, grad_norm = self.optimizer_step()
            loop.timer.end_step()
            self.state.step += 1
            loop.meter.step_done()
            step = self.state.step
            heartbeat.step(step)
            faults.after_step(self.ctx.rank, step)
            if loop.pending is not None:
                # The previous log step's values. Waiting for them here, with this step already queued, keeps the
                # GPU busy while the host logs; a sync right at the log step would drain its queue.
                self._finish_log(loop)
            with loop.meter.paused("profile", sync=loop.profiler.acts_after(step)):  # writing the trace is not a step
                loop.profiler.after_step(step)
            if loop.first_step_s is None:
                self._after_first_step(loop)
            if step % t.log_every == 0 or step == self.total_steps:
                self.log(loop, step, lr, grad_norm)
            val_due = self.parts.val_set is not None and t.val_every and step % t.val_every == 0 \
                and step != self.total_steps
            ckpt_due = self.checkpoints.save_due(step, self.total_steps)
            # Finished right away when nothing is in flight to keep busy (a CPU run: the step is already done, and a
            # late close would time the next step instead), and before anything that reads the losses or syncs.
            if loop.pending is not None and (loop.pending.ready is None or val_due or ckpt_due
                                             or step == self.total_steps):
                self._finish_log(loop)  # the checkpoint holds the losses
            if val_due and not loop.stop_agreed:  # an agreed stop saves first: the validation would only delay it
                try:
                    with loop.meter.paused("validation"):
                        loop.val_loss = self.validate(loop.writer, step, loop.progress, loop.val_metrics, stop)
                except StopAgreed as agreed:  # every rank left the validation at the same batch
                    self._stop(loop, agreed.signum, saved=False, during=f"the validation at step {step}")
                    return
            if ckpt_due:
                with loop.meter.paused("checkpoint"):  # the save's blocking time is not a training step
                    self.checkpoint(loop=loop)
            log_step = step % t.log_every == 0 or step == self.total_steps
            if (signum := loop.stop_agreed or (0 if log_step else stop.poll())) and step < self.total_steps:
                self._stop(loop, signum, saved=ckpt_due)
                return

    def _stop(self, loop: _Loop, signum: int, saved: bool, during: str | None = None, final: bool = False) -> None:
        """Every rank agreed to stop after this step: one complete checkpoint of it (unless one is saved or being
        saved already: the periodic or the final one, which this waits for), committed before the process ends.
        ``during``: the work the stop cut short (a validation), for the record; ``final``: the step is the last."""
        termination.taken()
        heartbeat.phase("checkpoint")
        if loop.pending is not None:
            self._finish_log(loop)  # the checkpoint holds the losses
        t0 = time.monotonic()
        with loop.meter.paused("checkpoint"):
            if not saved:
                self.checkpoint(final=final, loop=loop)
            self.checkpoints.wait()
        termination.done()  # committed: the process ends by itself from here
        name = f"step_{self.state.step}"
        self.stopped = {"step": self.state.step, "signal": signum, "checkpoint": name,
                        "save_s": round(time.monotonic() - t0, 3),
                        "signal_after_step": termination.requested_after(), "during": during,
                        "last_step": self.state.step >= self.total_steps}
        self._say(f"stop: signal {signum}: every rank stopped after step {self.state.step}"
                  + (f", during {during}" if during else "")
                  + f"; checkpoint {name} committed in {time.monotonic() - t0:.2f} s")

    def _end(self, loop: _Loop, stop: StopAgreement) -> None:
        """After the last optimizer step: the final checkpoint first, then the final validation, so that a stop from
        here on loses no step. A stop during the validation (the ranks vote after each of its batches) cuts it short,
        and the run ends stopped at its last step, which ``resume=<run dir>`` validates (docs/resume.md); a stop
        after both cuts nothing, and the run completes."""
        heartbeat.phase("finish")
        saved = self._holds_this_step(loop)  # resumed at its last step: a stop had cut its final validation short
        if not saved:
            with loop.meter.paused("checkpoint"):  # in the background where saves are: it overlaps the validation
                saved = self.checkpoint_final(loop)
        signum = loop.stop_agreed  # the last step's vote
        if self.parts.val_set is not None:
            try:
                if not signum:
                    with loop.meter.paused("validation"):
                        loop.val_loss = self.validate(loop.writer, self.state.step, loop.progress, loop.val_metrics,
                                                      stop)
            except StopAgreed as agreed:  # every rank left the validation at the same batch
                signum = agreed.signum
            if signum:
                self._stop(loop, signum, saved=saved, during="the final validation", final=True)
                return
        with loop.meter.paused("checkpoint"):
            self.checkpoints.wait()
        if saved:
            termination.done()  # every step is committed: a stop from here on cuts nothing
            faults.in_phase("finish", self.ctx.rank, self.state.step, self.ctx.local_dir)

    def _holds_this_step(self, loop: _Loop) -> bool:
        """Did this launch resume from this run's own checkpoint of the step it is at, and make no step since (a
        continued run whose final validation a stop had cut short: that checkpoint is its final one)?"""
        own = layout.join(self.checkpoints.root, f"step_{self.state.step}")
        return (self.resumed_from is not None and self.state.step == loop.start_step
                and self.resumed_from.rstrip("/") == own.rstrip("/"))

    def _start_loop(self) -> _Loop:
        ctx, t = self.ctx, self.cfg.train
        meter = metrics.StepMeter(self.plan.global_batch, ctx.world_size,
                                  self.parts.tokens_per_sample, self.parts.flops_per_sample,
                                  metrics.peak_flops(ctx.device_name, t.precision),
                                  sync=torch.cuda.synchronize if ctx.device.type == "cuda" else None,
                                  clock=timing.DeviceClock() if ctx.device.type == "cuda" else None)
        prof_cfg = t.get("profile") or {}
        profiler = profiling.StepProfiler(
            os.path.join(ctx.local_dir, layout.PROFILE), ctx.rank, self.state.step + int(prof_cfg.get("start", 0)),
            int(prof_cfg.get("steps", 0)), ctx.device, say=self._say if ctx.is_main else None,
        )
        writer = self._writer() if self.writer_future is not None else None
        progress = (Progress(ctx.console, self.total_steps, self.state.step, unit=self._rate_unit)
                    if ctx.is_main else None)
        timer = timing.PhaseTimer(ctx.device, int(t.get("timing_every", 1) or 0), first_step=self.state.step + 1)
        self.strategy.on_grads_ready(timer.grads_ready)  # when its gradient sync starts, if the strategy can tell
        startup.mark("loop_start")
        if writer is not None and self.resumed_from is not None:
            writer.resume_at(self.state.step)  # the interrupted attempt's later points are superseded
        s = self.state
        window = s.window_loss[ctx.rank] if s.logged_step is not None and ctx.rank < len(s.window_loss) else 0.0
        self.extras = task_metrics.Sums(ctx.device)
        return _Loop(meter, profiler, writer, progress, torch.tensor(window, device=ctx.device),
                     s.step if s.logged_step is None else s.logged_step, self.extras,
                     start_step=s.step, start_unix=startup.marked("loop_start"), timer=timer)

    def micro_step(self, batches: Any, loop: _Loop, *, first: bool, last: bool) -> None:
        """Forward and backward of one micro-batch; the strategy synchronises gradients on the ``last`` one only."""
        device = self.ctx.device
        heartbeat.phase("data")
        x, y, wait = next(batches)
        heartbeat.phase("sync" if last else "forward_backward")
        loop.meter.add_wait(wait)
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        loop.timer.mark("data")
        if self.strategy.cudagraphs:  # a new micro-step: the previous replay's outputs may be reused
            torch.compiler.cudagraph_mark_step_begin()
        with self.strategy.sync(last):  # no_sync around forward *and* backward of every micro-step but the last
            with _autocast(device, self.cfg.train.precision):
                loss, extra = task_metrics.split_output(self.strategy.forward(last)(x, y))
            scaled = loss / self.accumulation  # the mean over the optimizer step's micro-batches
            scaled = self.scaler.scale(scaled) if self.scaler is not None else scaled
            self.strategy.backward(scaled, first=first, last=last)
        loop.loss_sum += loss.detach().float()
        loop.extras.add(extra)
        self.state.micro_in_epoch += 1
        loop.timer.end_micro_step()

    def optimizer_step(self) -> tuple[float, torch.Tensor]:
        """Unscale (fp16), clip, step, advance the LR; returns the LR used and the grad norm (on the device)."""
        t = self.cfg.train
        params = self.strategy.params
        lr = self.optimizer.param_groups[0]["lr"]
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
            grad_norm = (torch.nn.utils.clip_grad_norm_(params, t.grad_clip) if t.grad_clip
                         else torch.nn.utils.get_total_norm([p.grad for p in params]))
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:  # every trained parameter has its gradient buffer (the strategy made them)
            grad_norm = grad_sync.clipped_step(self.optimizer, params, t.grad_clip)
        self.strategy.after_optimizer_step(self.optimizer, self.accumulation)
        self.scheduler.step()
        return lr, grad_norm

    def checkpoint_final(self, loop: _Loop) -> bool:
        """The final checkpoint (collective), with the open logging window's losses (none at the last step), written
        in the background where saves are (``self.checkpoints.wait()`` waits for it); False when none is due
        (``checkpoint.final=false``)."""
        if not self.checkpoints.final:
            return False
        termination.taken()  # a stop from here on waits for this save: it holds every step
        self.checkpoint(final=True, loop=loop)
        return True

    def _after_first_step(self, loop: _Loop) -> None:
        """The first step of this launch (step 1, or the first after a resume): time it, ready the save's
        buffers, and freeze what compilation left on the heap."""
        if self.ctx.device.type == "cuda":
            torch.cuda.synchronize()
        loop.first_step_end_unix = time.time()
        loop.first_step_s = loop.first_step_end_unix - float(os.environ.get(layout.ENV_T0, time.time()))
        if self.cfg.train.compile:
            facts = self._compile_facts() or {}
            self._say(f"compile: first step {loop.first_step_s:.1f} s from launch, scope {facts.get('scope')},"
                      f" cache {facts.get('cache_dir')}: {facts.get('cache_hits', 0)} hits,"
                      f" {facts.get('cache_misses', 0)} misses")
        self.checkpoints.reserve()  # optimizer state exists now: get the save's buffers ready
        # Compilation leaves many long-lived Python objects; every full collection would walk them all and
        # stall this rank's host, and with DDP a stall on any rank stalls all. Frozen, they are not walked
        # again (torchtitan and Megatron manage the GC for the same reason). Measured: BENCHMARKS.md.
        with loop.meter.paused("gc", sync=False):  # the device was drained just above
            gc.collect()
            gc.freeze()

    def log(self, loop: _Loop, step: int, lr: float, grad_norm: torch.Tensor) -> None:
        """Start gathering this log step's values (and the stop vote) from every rank; :meth:`_finish_log` writes
        them later."""
        heartbeat.phase("log")
        loop.window_end = loop.meter.boundary()  # after this step's work, in the device's order
        loop.pending = tb.PendingLog.start(
            step, loop.loss_sum / self.accumulation / (step - loop.logged_step), grad_norm, lr, loop.meter.steps,
            self.ctx.world_size, self.telemetry.window() if self.telemetry else None, loop.timer.window(),
            stop=self.stop_vote.mine() if self.stop_vote is not None else 0,
            extra=loop.extras.take() if loop.extras.names else None)
        loop.logged_step = step
        loop.loss_sum.zero_()

    def _finish_log(self, loop: _Loop) -> None:
        """Wait for a log step's reduced values, then write its scalars and progress."""
        heartbeat.phase("log")
        pending, loop.pending = loop.pending, None
        assert pending is not None
        train_loss, gnorm, gpus, times = pending.values()
        loop.stop_agreed = loop.stop_agreed or pending.stop_vote()
        last = {"train/loss": train_loss, **task_metrics.named(loop.extras.names, pending.extra_means(), "train"),
                "lr": pending.lr, "grad_norm": gnorm,
                **loop.meter.close_window(pending.window_steps, end=loop.window_end),
                "memory/peak_gb": tb.peak_memory_gb(self.ctx.device)}
        self.state.losses.append(train_loss)
        for r, g in gpus.items():
            self.gpu_windows.setdefault(r, []).append(g)
        for r, w in times.items():
            self.time_windows.setdefault(r, []).append(w)
        if loop.writer is not None:  # every rank's GPU and phase times, gathered: rank 0 logs them all
            loop.writer.log({**last, **{f"gpu{r}/{k}": v for r, g in gpus.items() for k, v in g.items()},
                             **timing.scalars(times)}, pending.step)
        if loop.progress is not None:
            rate_key = "perf/tokens_per_s" if self._rate_unit == "tokens/s" else "perf/samples_per_s"
            loop.progress.update(pending.step, train_loss, last.get(rate_key) or last["perf/samples_per_s"])
        loop.last = last

    @property
    def _rate_unit(self) -> str:
        """What the console's throughput counts: tokens for a task with tokens, else samples."""
        return "tokens/s" if self.parts.tokens_per_sample else "samples/s"

    def validate(self, writer: Any, step: int, progress: Progress | None = None,
                 metrics: dict[str, float] | None = None, stop: StopAgreement | None = None) -> float:
        """Exact validation loss (every sample once across ranks), logged at ``step`` and shown on the console;
        ``metrics`` receives the task's extra metrics over the same samples (``val/<name>``). ``stop``: the ranks'
        stop vote, taken after every batch; a stop it agrees on cuts the validation short (``StopAgreed``, nothing
        logged). The random generators are left as found (each data loader draws a seed from them): whether and
        where a run validates never changes its training, nor a checkpoint saved around a validation."""
        heartbeat.phase("validate")
        faults.in_phase("validation", self.ctx.rank, step, self.ctx.local_dir)
        data = self.parts.val_set
        cap = self.cfg.train.get("val_samples")
        if cap and cap < len(data):  # the same leading samples every time, each counted once
            data = Subset(data, range(cap))
        found: dict[str, float] = {}
        v, t0 = self.validation, time.perf_counter()
        # Ends with the loss on the host: the device's work is in the time.
        with val_compile.counting(v), torch.random.fork_rng(devices=[]):
            loss = evaluate(self.model, data, self.ctx, self.per_rank, self.cfg.train.precision,
                            lockstep=self.strategy.collective_forward, metrics=found, names=self._metric_names(data),
                            compile_mode=v["compile_mode"], stop=stop.poll if stop is not None else None)
        v["last_s"] = time.perf_counter() - t0
        v["runs"], v["seconds"] = v["runs"] + 1, v["seconds"] + v["last_s"]
        extra = task_metrics.named(tuple(found), list(found.values()), "val")
        if writer is not None:
            writer.log({"val/loss": loss, **extra, "time/validation_s": v["last_s"]}, step)
        self._say(f"step {step} val/loss {loss:.4f}" + "".join(f" {k} {val:.4g}" for k, val in extra.items()))
        self._say(f"validation: {v['last_s']:.2f} s ({v['compile_mode']}; graphs compiled in validations so far:"
                  f" {v['graphs_compiled']})")
        if progress is not None:  # and on the user's console
            progress.validated(step, loss, extra)
        if metrics is not None:
            metrics.update(extra)
        return loss

    def _metric_names(self, data: Dataset) -> tuple[str, ...]:
        """The task's extra metric names: from training, else from one forward on the first validation sample
        (every rank the same one, so a sharded model's forward stays collective)."""
        names = self.extras.names if self.extras is not None else None
        if names is None:
            x, y = next(iter(DataLoader(data, batch_size=1)))
            was_training = self.model.training
            self.model.eval()
            with torch.no_grad(), _autocast(self.ctx.device, self.cfg.train.precision), \
                    val_compile.stance(self.validation["compile_mode"], first_batch=False):  # no batch-1 graph
                _, extra = task_metrics.split_output(self.model(x.to(self.ctx.device), y.to(self.ctx.device)))
            self.model.train(was_training)
            names = tuple(sorted(extra))
        return names

    def _finish(self, loop: _Loop) -> dict[str, Any]:
        """The summary, once training has ended (its final checkpoint and validation done) or stopped."""
        heartbeat.phase("finish")
        if loop.progress is not None:
            loop.progress.close()
        summary = {
            "steps": self.state.step, "epochs_started": self.state.epoch + (self.state.micro_in_epoch > 0),
            "final": dict(loop.last),
            "val_loss": loop.val_loss,
            # The task's extra metrics (tasks/api.py): the last logged train/<name>, the last validation's val/<name>.
            "metrics": {**{k: v for k, v in loop.last.items() if k.startswith("train/") and k != "train/loss"},
                        **loop.val_metrics},
            "median": loop.meter.medians(),
            **self._series(loop),
            # Each rank's GPU: medians over the logging windows but the first (compilation); empty without NVML.
            "gpus": {str(r): gpu_telemetry.medians(ws[1:] or ws) for r, ws in sorted(self.gpu_windows.items())},
            "time_to_first_step_s": loop.first_step_s,
            "goodput": self._goodput(loop),
            # Each rank's data, compute, exposed gradient sync and optimizer time per step; slowest and fastest rank.
            "time_breakdown": timing.summarize(self.time_windows, loop.timer.every),
            # Gradient and parameter bytes, threads and cores: what the scaling projection prices (ddp-compare).
            **scaling_facts(self.strategy.params, self.cfg),
            "compile": self._compile_facts(),
            # How often validation ran, its seconds (also goodput's "validation") and the graphs it compiled.
            "validation": dict(self.validation) if self.validation["runs"] else None,
            "resumed_from": self.resumed_from,
            "stopped": self.stopped,
            "stop_vote": self.stop_vote.stats() if self.stop_vote is not None else None,
        }
        if loop.writer is not None:
            loop.writer.close()
            summary["trackers"] = loop.writer.report()
        return summary

    def _series(self, loop: _Loop) -> dict[str, Any]:
        """summary.json's series, each at most ``series.MAX_POINTS`` points with the step of each (the full ones are
        in TensorBoard): ``losses`` (every logged train loss since step 0, a resume's earlier ones included) and
        ``perf_windows`` (this launch's logging windows but the first: start-up and compilation)."""
        every, done = self.cfg.train.log_every, self.state.step
        losses, loss_steps = series.bounded(self.state.losses, series.log_steps(len(self.state.losses), every, done))
        history = loop.meter.history
        ends = window_ends(loop.start_step, done, every)[1:]
        n = len(history["step_time_s"])
        ends = (ends + [done] * n)[:n]  # as many ends as windows, whatever a stop left open
        keep = series.kept_indices(history["step_time_s"])
        windows: dict[str, Any] = {k: [v[i] for i in keep] if len(v) == n else list(v) for k, v in history.items()}
        windows.update(steps=[ends[i] for i in keep], count=n)
        return {"perf_windows": windows, "perf_span_unix": loop.meter.span_unix,  # when those windows ran
                "losses": losses, "loss_steps": loss_steps, "losses_logged": len(self.state.losses)}

    def _goodput(self, loop: _Loop) -> dict[str, Any]:
        """Throughput over this launch's whole wall-clock (from the driver's start), the shares of start-up,
        the first step (compilation), checkpoints, validation and training, and the time to the first committed
        checkpoint."""
        now = time.time()
        t0 = float(os.environ.get(layout.ENV_T0, loop.start_unix))
        first_end = loop.first_step_end_unix or now
        steps = self.state.step - loop.start_step
        out = metrics.goodput(
            wall_s=now - t0, startup_s=loop.start_unix - t0, first_step_s=first_end - loop.start_unix,
            excluded={k: v for k, v in loop.meter.excluded.items() if v > 0},
            samples=steps * self.plan.global_batch,
            tokens_per_sample=self.parts.tokens_per_sample)
        committed = self.checkpoints.first_commit_unix
        out["time_to_first_checkpoint_s"] = committed - t0 if committed is not None else None
        out["startup_parts"] = startup.parts()  # where the start-up went, on rank 0
        return out

    def _compile_facts(self) -> dict[str, Any] | None:
        """How this rank (rank 0 reports) compiled: the scope, the cache directory, its hits and misses, and the
        seconds torch spent per compile phase."""
        t = self.cfg.train
        if not t.compile:
            return None
        return {"scope": t.get("compile_scope") or "model", "cache_dir": self.compile_cache,
                **(compile_cache.hits() if self.compile_cache else {}), "seconds": compile_cache.seconds()}

    def close(self) -> None:
        """Finish the checkpoint in flight and stop DataLoader worker processes now, not at interpreter exit."""
        self.checkpoints.close()
        if self.telemetry is not None:
            self.telemetry.close()
        self.loader = None  # persistent workers stop when their iterator is collected
        gc.collect()  # the LR lambda's closure makes a cycle through the trainer

    def _writer(self) -> Trackers:
        """Rank 0's loggers (opened in the background at start-up); TensorBoard gets the plan and settings."""
        trackers = self.writer_future.result()
        board = next((t for t in trackers.trackers if isinstance(t, TensorBoard)), None)
        if board is None:
            return trackers
        cfg = self.cfg
        plan = self.plan.as_dict()
        # A sweep's swept values too: its jobs sit side by side in HPARAMS (tensorboard --logdir <sweep dir>).
        hparams = {"task": cfg.task.name, "lr": cfg.train.lr, "precision": cfg.train.precision, "device": cfg.device,
                   **tb.swept_values(self.ctx.run_dir)}
        board.start(plan, hparams, tokens=bool(self.parts.tokens_per_sample))
        return trackers


def run(run_dir: str, local_dir: str, console: IO[str] | None) -> None:
    """Train this rank to the end, then report ``rank R device D completed``."""
    cfg = load_config(run_dir)
    faults.configure(cfg.get("fault"))
    preempt, grace_s = stops.of(cfg.get("checkpoint"))
    termination.configure(grace_s, preempt)
    writer_future = None
    if int(os.environ.get("RANK", "0")) == 0:
        # The loggers' imports (and the trackers' first requests) overlap the process-group and DDP set-up instead
        # of delaying the first step.
        writer_future = ThreadPoolExecutor(1).submit(open_trackers, cfg, run_dir, local_dir, console)
    t0 = time.perf_counter()
    console_progress.stage(console, "joining the process group")
    ctx = setup(run_dir, local_dir, console, cfg)
    startup.mark("process_group")
    console_progress.stage(console, "building the model and data")
    print(f"startup: process group ready in {time.perf_counter() - t0:.1f} s", flush=True)
    worker_io.write_json(local_dir, layout.rank_facts(ctx.rank), _facts(ctx, completed=False))
    failed = False
    try:
        trainer = Trainer(cfg, ctx, writer_future)
        trainer.maybe_resume()
        heartbeat.start(local_dir, ctx.rank, trainer.state.step, enabled=bool((cfg.get("watchdog") or {}).get(
            "timeout_s")), nccl=cfg.backend == "nccl")
        startup.mark("ready")
        console_progress.stage(console, "first step")
        print(f"startup: task, model, DDP and data ready in {time.perf_counter() - t0:.1f} s", flush=True)
        summary = trainer.train()
        trainer.close()
        if ctx.device.type == "cuda":
            torch.cuda.synchronize()
        dist.barrier()
        heartbeat.phase("done")
        heartbeat.stop()
        stopped = trainer.stopped
        line = f"rank {ctx.rank} device {_device_label(ctx)} " + (
            f"stopped at step {stopped['step']}" if stopped else "completed")
        print(line, flush=True)
        worker_io.write_json(local_dir, layout.rank_facts(ctx.rank),
                             _facts(ctx, completed=stopped is None, exit_code=0, stopped=stopped,
                                    summary=summary if ctx.is_main else None))
        if stopped:
            termination.done()
    except BaseException as exc:  # noqa: B036 - the time of any failure, before the teardown below
        failed = True
        worker_io.mark_failure_time(exc)
        heartbeat.flush()  # the step this rank reached: its peers may be killed before they record theirs
        # Recorded before the teardown too (tasks/__main__.py writes the same record again): should the teardown
        # ever wait on a peer, the driver still learns what failed here.
        worker_io.record_error(local_dir, ctx.rank, exc)
        raise
    finally:
        if dist.is_initialized():
            if failed and dist.get_backend() == dist.Backend.NCCL:
                # A peer may be waiting in a collective this rank will never join, and NCCL's orderly teardown can
                # wait for it: this rank would hang before recording its error, and torchrun would never learn
                # of the failure. Aborting the communicators does not wait. (A private API: if it is gone, the
                # process exits without tearing the group down, which does not wait either.)
                with contextlib.suppress(Exception):
                    dist.distributed_c10d._abort_process_group()
            else:
                dist.destroy_process_group()
