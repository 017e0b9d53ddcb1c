"""The one training engine. Every task supplies model, data and loss (``tasks.api.TaskParts``); this owns
the loop: process group, DDP, sampler, accumulation, precision, optimizer, schedule, validation,
TensorBoard scalars, checkpoints and resume.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import math
import os
import resource
import signal
import socket
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from typing import IO, Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, Subset

from runner import layout
from runner.plan import SCHEDULES, flatten
from tasks import checkpoint as ckpt
from tasks import ddp_compile, gpu_telemetry, grad_sync, metrics, profiling, termination, worker_io
from tasks.api import TaskParts
from tasks.config import Config, load_config
from tasks.progress import Progress
from tasks.sampler import ResumableDistributedSampler

AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
CUDAGRAPH_MODES = ("reduce-overhead", "max-autotune")  # torch.compile modes that capture CUDA graphs


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


@dataclass
class TrainState:
    """Where training stands: enough to continue exactly from here."""

    step: int = 0            # optimizer steps done
    epoch: int = 0           # current epoch
    micro_in_epoch: int = 0  # micro-batches of the current epoch already consumed
    losses: list[float] = field(default_factory=list)


def _setup(run_dir: str, local_dir: str, console: IO[str] | None, cfg: Config) -> Context:
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    if cfg.device == "cuda":
        torch.cuda.set_device(local_rank)  # local rank indexes the visible devices
        torch.backends.cuda.matmul.allow_tf32 = True  # fp32 matmuls outside autocast use tensor cores
        torch.backends.cudnn.allow_tf32 = True
        device = torch.device("cuda", local_rank)
        name = torch.cuda.get_device_name(device)
    else:
        device, name = torch.device("cpu"), "cpu"
    dist.init_process_group(
        cfg.backend, timeout=timedelta(seconds=cfg.timeout_s),
        device_id=device if device.type == "cuda" else None,
    )
    return Context(rank, local_rank, world_size, device, run_dir, local_dir, console, name)


def _device_label(ctx: Context) -> str:
    return f"{ctx.device.type}:{ctx.local_rank}"


def _facts(ctx: Context, **extra: Any) -> dict[str, Any]:
    facts: dict[str, Any] = {
        "rank": ctx.rank, "local_rank": ctx.local_rank, "host": socket.gethostname(), "pid": os.getpid(),
        "device": _device_label(ctx), "device_name": ctx.device_name,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "torch": torch.__version__, "backend": dist.get_backend() if dist.is_initialized() else None,
        "restart_count": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
    }
    if ctx.device.type == "cuda":
        facts["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        facts["cuda"] = torch.version.cuda
    facts.update(extra)
    return facts


def _optimizer(cfg: Config, model: torch.nn.Module, device: torch.device) -> torch.optim.Optimizer:
    t = cfg.train
    params = [p for p in model.parameters() if p.requires_grad]
    if t.optimizer == "sgd":
        return torch.optim.SGD(params, lr=t.lr, momentum=t.momentum, weight_decay=t.weight_decay)
    if t.optimizer == "adamw":
        # Decay matrices only (nanoGPT's rule): norms and biases are not regularised.
        decay = [p for p in params if p.dim() >= 2]
        no_decay = [p for p in params if p.dim() < 2]
        groups = [{"params": decay, "weight_decay": t.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
        # Fused on every device (PyTorch has CPU and CUDA kernels): one kernel per step, and the clip factor folds
        # into it (grad_sync.clipped_step), so CPU runs take the same path as GPU runs.
        return torch.optim.AdamW(groups, lr=t.lr, betas=tuple(t.betas), fused=True)
    raise ValueError(f"train.optimizer={t.optimizer!r}: unknown optimizer. Fix: use sgd or adamw")


def lr_factor(step: int, total: int, schedule: str, warmup: int, min_ratio: float) -> float:
    """Multiplier of the base LR at optimizer step ``step`` (0-based): linear warmup, then constant or cosine.

    Cosine falls from 1 after the warmup to ``min_ratio`` at step ``total`` and stays there.
    """
    # Checked before the warmup branch: LambdaLR calls this at construction (step 0), so a bad schedule fails
    # at start-up instead of after the warmup.
    if schedule not in SCHEDULES:
        raise ValueError(f"train.schedule={schedule!r}: unknown schedule. Fix: use constant or cosine")
    if warmup and step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    span = max(1, total - warmup)
    progress = min(1.0, (step - warmup) / span)
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def apply_inductor_settings(settings: dict[str, Any]) -> None:
    """Set ``train.inductor`` (nested or dotted names) on torch._inductor.config; the driver checked the names."""
    import torch._inductor.config as inductor_config

    for key, value in flatten(settings).items():
        setattr(inductor_config, key, value)


def inject_fault(rank: int, step: int) -> None:
    """Fault injection for tests: ``DDP_RUNNER_FAULT=<kind>@<rank>:<step>[,…]`` with kind raise|kill|hang.

    Only the first attempt of a run is faulted, so an elastic restart can be shown to recover.
    """
    spec = os.environ.get("DDP_RUNNER_FAULT")
    if not spec or os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
        return
    for one in spec.split(","):
        kind, _, where = one.partition("@")
        r, _, s = where.partition(":")
        if int(r) == rank and int(s) == step:
            _fault(kind, rank, step)


def _fault(kind: str, rank: int, step: int) -> None:
    if kind == "raise":
        raise RuntimeError(f"injected fault on rank {rank} at step {step}")
    if kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if kind == "hang":
        time.sleep(10**6)


@torch.no_grad()
def evaluate(model: torch.nn.Module, data: Dataset, ctx: Context, batch: int, precision: str) -> float:
    """Mean loss over the whole dataset, each sample counted exactly once across ranks.

    DistributedSampler pads uneven splits with duplicates; here rank r takes samples r, r+W, r+2W, … with
    no padding, and the sums and counts are reduced across ranks.
    """
    was_training = model.training
    model.eval()
    shard = Subset(data, range(ctx.rank, len(data), ctx.world_size))
    totals = torch.zeros(2, dtype=torch.float64, device=ctx.device)
    for x, y in DataLoader(shard, batch_size=batch, shuffle=False):
        with _autocast(ctx.device, precision):
            loss = model(x.to(ctx.device), y.to(ctx.device))
        totals[0] += loss.double() * len(x)
        totals[1] += len(x)
    dist.all_reduce(totals)
    model.train(was_training)
    return (totals[0] / totals[1]).item()


def _autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    dtype = AUTOCAST_DTYPES.get(precision)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


def _peak_memory_gb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB (peak RSS)


class _SingleProcess(torch.nn.Module):
    """Stands in for DDP at world size 1: same call and ``no_sync`` surface, no communication."""

    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    def no_sync(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()


@dataclass
class _PendingLog:
    """A log step's loss, grad norm and GPU telemetry from every rank, gathered and on their way to the host
    without a sync."""

    step: int
    host: torch.Tensor            # (world, 2 + telemetry fields) per rank; valid once ``ready`` is done
    ready: torch.cuda.Event | None
    lr: float
    window_steps: int             # optimizer steps of the perf window that ends with this step

    @classmethod
    def start(cls, step: int, mean_loss: torch.Tensor, grad_norm: torch.Tensor, lr: float, window_steps: int,
              world_size: int, gpu: dict[str, float] | None = None) -> _PendingLog:
        # One small all-gather: the logged loss is the global mean over the whole global batch, and rank 0 logs
        # every rank's GPU. Every rank sends the same length (NaN where it has no telemetry), so ranks that
        # disagree about NVML cannot mismatch the collective.
        dev = mean_loss.device
        tele = torch.tensor([math.nan if gpu is None else gpu[k] for k in gpu_telemetry.FIELDS])
        if dev.type == "cuda":  # from pinned memory, without a sync: a blocking copy would drain the GPU's queue
            tele = tele.pin_memory().to(dev, non_blocking=True)
        stats = torch.cat([torch.stack([mean_loss, grad_norm.detach().float().to(dev)]), tele])
        gathered = stats.new_empty(world_size * stats.numel())
        dist.all_gather_into_tensor(gathered, stats)
        gathered = gathered.view(world_size, -1)
        if dev.type != "cuda":
            return cls(step, gathered, None, lr, window_steps)
        host = torch.empty(gathered.shape, pin_memory=True)
        host.copy_(gathered, non_blocking=True)
        ready = torch.cuda.Event()
        ready.record()
        return cls(step, host, ready, lr, window_steps)

    def values(self) -> tuple[float, float, dict[int, dict[str, float]]]:
        """Mean loss and grad norm over the ranks, and each rank's GPU telemetry where it has some (waits for
        the copy)."""
        if self.ready is not None:
            self.ready.synchronize()
        loss, gnorm = self.host[:, :2].mean(dim=0).tolist()
        gpus = {r: dict(zip(gpu_telemetry.FIELDS, row[2:].tolist(), strict=True))
                for r, row in enumerate(self.host) if not math.isnan(row[2].item())}
        return loss, gnorm, gpus


class Trainer:
    """One run of the training loop on this rank."""

    def __init__(self, cfg: Config, ctx: Context, writer_future: Future | None = None) -> None:
        self.cfg, self.ctx = cfg, ctx
        self.writer_future = writer_future
        t = cfg.train
        torch.manual_seed(cfg.seed)  # same init on every rank (DDP also broadcasts rank 0's weights)
        task = importlib.import_module(f"tasks.{cfg.task.name}")
        self.parts: TaskParts = task.build(cfg, ctx.device)
        self.model = self.parts.model.to(ctx.device)
        # Same weights everywhere, but each rank its own random stream from here on (dropout masks must
        # differ across ranks that see different data). A resume restores every rank's saved stream.
        torch.manual_seed(cfg.seed + ctx.rank)
        if ctx.world_size > 1:
            self.ddp: DDP | _SingleProcess = DDP(
                self.model, device_ids=[ctx.local_rank] if ctx.device.type == "cuda" else None,
                gradient_as_bucket_view=True, bucket_cap_mb=t.get("ddp_bucket_mb", 25),
            )
            if t.get("ddp_comm", "fp32") == "bf16":
                # Opt-in: gradients travel as bf16 (half the bytes), are averaged, and land back in fp32.
                from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

                self.ddp.register_comm_hook(None, default_hooks.bf16_compress_hook)
            else:  # averaging inside the all-reduce instead of one division kernel per parameter
                self.ddp.register_comm_hook(None, grad_sync.mean_allreduce_hook)
        else:  # one rank: nothing to synchronise, and compile sees one graph instead of DDP's bucketed ones
            self.ddp = _SingleProcess(self.model)
        compile_kwargs = {"mode": t.compile_mode} if t.get("compile_mode") else {}
        if t.compile and t.get("inductor"):
            apply_inductor_settings(t.inductor)
        # The synchronising micro-step's callable, and the others' (tasks/ddp_compile.py says why they differ).
        self.forward, self.forward_local = ddp_compile.compiled_forwards(
            self.ddp, self.model, distributed=ctx.world_size > 1, compile=bool(t.compile),
            split=bool(t.get("ddp_split_graph", True)), **compile_kwargs)
        # These modes replay each micro-step as CUDA graphs: no per-kernel launch cost, so the GPU does not wait
        # for the host to launch kernels.
        self.cudagraphs = bool(t.compile) and ctx.device.type == "cuda" and t.get("compile_mode") in CUDAGRAPH_MODES
        self.optimizer = _optimizer(cfg, self.model, ctx.device)
        # Gradients live in their own buffers for the whole run: the first micro-step of an optimizer step copies
        # into them and later ones add (see _accumulate), so they need no zeroing pass. Under CUDA graphs they
        # must not *be* graph outputs, which the next replay overwrites (pytorch/pytorch#169545).
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        for p in self.params:
            p.grad = torch.zeros_like(p)
        self.scaler = torch.amp.GradScaler(ctx.device.type) if t.precision == "fp16" else None
        self.per_rank, self.accumulation = cfg.batch.per_rank, cfg.batch.accumulation
        self.sampler = ResumableDistributedSampler(
            self.parts.train_set, num_replicas=ctx.world_size, rank=ctx.rank, shuffle=True, seed=cfg.seed,
        )
        # drop_last keeps every micro-batch exactly batch.per_rank, so the global batch is what the plan says.
        self.loader = DataLoader(
            self.parts.train_set, batch_size=self.per_rank, sampler=self.sampler, drop_last=True,
            num_workers=t.num_workers, pin_memory=ctx.device.type == "cuda",
            persistent_workers=t.num_workers > 0, worker_init_fn=termination.reset_in_child,
        )
        self.steps_per_epoch = (self.sampler.num_samples // self.per_rank) // self.accumulation
        if self.steps_per_epoch == 0:
            raise ValueError(
                f"batch.accumulation={self.accumulation}: an epoch gives each rank only"
                f" {self.sampler.num_samples // self.per_rank} micro-batches, fewer than one optimizer step."
                " Fix: lower batch.accumulation, batch.per_rank or world_size, or use more data"
            )
        self.state = TrainState()
        self.total_steps = self._total_steps()
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer,
            lambda s: lr_factor(s, self.total_steps, t.schedule, t.warmup_steps, t.min_lr_ratio),
        )
        self.resumed_from: str | None = None
        self.saver = ckpt.AsyncSaver() if (ctx.is_main and cfg.checkpoint.async_save) else None
        if self.saver is not None:  # stopped by SIGTERM (a peer failed, or Ctrl-C): finish the write in flight
            termination.on_terminate(self.saver.finish)
        self.ckpt_root = layout.join(ctx.run_dir, layout.CHECKPOINTS)
        # Clock, power, temperature and power-cap state of this rank's GPU, per logging window (None: no NVML).
        self.telemetry = gpu_telemetry.Sampler.start(ctx.device) if t.get("gpu_telemetry", True) else None
        self.gpu_windows: dict[int, list[dict[str, float]]] = {}

    # -- checkpoints -----------------------------------------------------------------------------------

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

    def _resume_source(self) -> str | None:
        """Newest complete checkpoint of this run (elastic restart / continue in place), else ``resume``.

        A run's own checkpoints always win, whatever ``resume`` says: they are this run's progress (an elastic
        restart of a ``resume=never`` run must not start over and then have keep_last delete its fresh
        checkpoints as "older" than the previous attempt's). ``resume`` says where a run with none starts.
        """
        resume = str(self.cfg.resume)
        own = ckpt.latest(self.ckpt_root)
        if own is not None or resume in ("auto", "never"):
            return own
        if ckpt.is_checkpoint(resume):
            return resume
        found = ckpt.latest(resume) or ckpt.latest(layout.join(resume, layout.CHECKPOINTS))
        if found is None:
            raise ValueError(f"resume={resume!r}: no complete checkpoint there. Fix: point resume at a"
                             " run directory with checkpoints/step_<N>, a checkpoint, or use resume=never")
        return found

    def maybe_resume(self) -> None:
        """Load model, optimizer, scheduler, scaler, progress and this rank's RNG state from a checkpoint."""
        src = self._resume_source()
        if src is None:
            return
        state = ckpt.load(src, map_location="cpu")
        self._check_compatible(state, src)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        p = state["progress"]
        # The data position is counted in micro-batches of the checkpoint's per-rank batch.
        samples = p["micro_in_epoch"] * state.get("plan", {}).get("per_rank_batch", self.per_rank)
        self.state = TrainState(p["step"], p["epoch"], samples // self.per_rank, list(p.get("losses", [])))
        self.total_steps = self._total_steps()
        ckpt.set_rng_state(state["rng"][self.ctx.rank])
        self.resumed_from = src
        self._say(f"resumed from {src} at step {self.state.step}")

    def _check_compatible(self, state: dict[str, Any], src: str) -> None:
        mine = self.model.state_dict()
        theirs = state["model"]
        problems = [f"{k}: checkpoint {tuple(v.shape)} vs model {tuple(mine[k].shape)}"
                    for k, v in theirs.items() if k in mine and tuple(v.shape) != tuple(mine[k].shape)]
        problems += [f"{k}: missing in checkpoint" for k in mine if k not in theirs]
        problems += [f"{k}: not in this model" for k in theirs if k not in mine]
        if problems:
            raise ValueError(f"cannot resume from {src}: the model differs ({len(problems)} keys): "
                             + "; ".join(problems[:8]) + ". Fix: resume with the same task.model settings")
        plan = state.get("plan", {})
        if plan.get("world_size") not in (None, self.ctx.world_size):
            raise ValueError(f"cannot resume from {src}: it ran with world_size={plan['world_size']}, this run"
                             f" has {self.ctx.world_size}. Fix: resume with world_size={plan['world_size']}")
        done = state["progress"]["micro_in_epoch"] * plan.get("per_rank_batch", self.per_rank)
        if done % self.per_rank:
            raise ValueError(f"cannot resume from {src}: each rank had used {done} samples of the epoch, not a"
                             f" whole number of batch.per_rank={self.per_rank} micro-batches, so the data order"
                             f" would not continue exactly. Fix: resume with batch.per_rank="
                             f"{plan['per_rank_batch']} (or a divisor of {done})")

    def save_checkpoint(self) -> None:
        """Every rank hands its RNG state to rank 0 (one collective), which saves atomically."""
        rng = [None] * self.ctx.world_size
        dist.all_gather_object(rng, ckpt.rng_state())
        if not self.ctx.is_main:
            return
        s = self.state
        state = {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "progress": {"step": s.step, "epoch": s.epoch, "micro_in_epoch": s.micro_in_epoch,
                         "losses": list(s.losses)},
            "rng": rng,
            "plan": {"world_size": self.ctx.world_size, "per_rank_batch": self.per_rank,
                     "accumulation": self.accumulation,
                     "global_batch": self.per_rank * self.ctx.world_size * self.accumulation},
            "config": self.cfg.to_yaml(),
        }
        protect = frozenset({self.resumed_from} if self.resumed_from else ())
        keep = self.cfg.checkpoint.keep_last
        if self.saver is not None:
            self.saver.save(self.ckpt_root, s.step, state, keep_last=keep, protect=protect)
        else:
            ckpt.save(self.ckpt_root, s.step, state, keep_last=keep, protect=protect)

    # -- the loop --------------------------------------------------------------------------------------

    def _say(self, msg: str) -> None:
        print(msg, flush=True)

    def _micro_batches(self):
        """Yield (x, y, data_wait_s) forever, epoch after epoch, calling set_epoch every epoch."""
        while True:
            self.sampler.set_epoch(self.state.epoch)
            self.sampler.set_start(self.state.micro_in_epoch * self.per_rank)
            usable = self.steps_per_epoch * self.accumulation
            it = iter(self.loader)
            while self.state.micro_in_epoch < usable:
                t0 = time.perf_counter()
                x, y = next(it)
                yield x, y, time.perf_counter() - t0
            self.state.epoch += 1
            self.state.micro_in_epoch = 0

    def train(self) -> dict[str, Any]:
        cfg, ctx, t = self.cfg, self.ctx, self.cfg.train
        writer = self._writer() if self.writer_future is not None else None
        progress = Progress(ctx.console, self.total_steps, self.state.step) if ctx.is_main else None
        device, acc = ctx.device, self.accumulation
        meter = metrics.StepMeter(self.per_rank * ctx.world_size * acc, ctx.world_size,
                                  self.parts.tokens_per_sample, self.parts.flops_per_sample,
                                  metrics.peak_flops(ctx.device_name, t.precision))
        batches = self._micro_batches()
        loss_acc = torch.zeros((), device=device)
        prof_cfg = t.get("profile") or {}
        profiler = profiling.StepProfiler(
            os.path.join(ctx.local_dir, layout.PROFILE), ctx.rank, self.state.step + int(prof_cfg.get("start", 0)),
            int(prof_cfg.get("steps", 0)), device, say=self._say if ctx.is_main else None,
        )
        first_step_s: float | None = None
        val_loss: float | None = None
        last: dict[str, float] = {}
        pending: _PendingLog | None = None
        logged_step = self.state.step
        while self.state.step < self.total_steps:
            with meter.paused():
                profiler.before_step(self.state.step + 1)
            for m in range(acc):
                x, y, wait = next(batches)
                meter.add_wait(wait)
                x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                # no_sync around forward *and* backward of every micro-step but the last.
                last_micro = m == acc - 1
                sync = contextlib.nullcontext() if last_micro else self.ddp.no_sync()
                if self.cudagraphs:  # a new micro-step: the previous replay's outputs may be reused
                    torch.compiler.cudagraph_mark_step_begin()
                with sync:
                    with _autocast(device, t.precision):
                        loss = (self.forward if last_micro else self.forward_local)(x, y)
                    scaled = loss / acc
                    scaled = self.scaler.scale(scaled) if self.scaler is not None else scaled
                    if last_micro and ctx.world_size > 1:
                        scaled.backward()  # DDP's hooks all-reduce p.grad (the sum so far) during this backward
                    else:
                        self._accumulate(scaled, first=m == 0)
                loss_acc += loss.detach().float()
                self.state.micro_in_epoch += 1
            lr, grad_norm = self._optimizer_step()
            self.state.step += 1
            meter.step_done()
            step = self.state.step
            inject_fault(ctx.rank, step)
            if pending is not None:
                # The previous log step's values. Waiting for them here, with this step already queued, keeps the
                # GPU busy while the host logs; a sync right at the log step would drain its queue.
                last = self._finish_log(pending, meter, writer, progress)
                pending = None
            with meter.paused():  # writing the trace is not a training step
                profiler.after_step(step)

            if first_step_s is None:  # the first step of this launch (step 1, or the first after a resume)
                if device.type == "cuda":
                    torch.cuda.synchronize()
                first_step_s = time.time() - float(os.environ.get("DDP_RUNNER_T0", time.time()))
                if self.saver is not None:  # optimizer state exists now: get the save's buffers ready
                    self.saver.reserve({"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()})
                # Compilation leaves many long-lived Python objects; every full collection would walk them all and
                # stall this rank's host, and with DDP a stall on any rank stalls all. Frozen, they are not walked
                # again (torchtitan and Megatron manage the GC for the same reason). Measured: BENCHMARKS.md.
                with meter.paused():
                    gc.collect()
                    gc.freeze()
            if step % t.log_every == 0 or step == self.total_steps:
                pending = _PendingLog.start(step, loss_acc / acc / (step - logged_step), grad_norm, lr, meter.steps,
                                            ctx.world_size, self.telemetry.window() if self.telemetry else None)
                logged_step = step
                loss_acc.zero_()

            val_due = self.parts.val_set is not None and t.val_every and step % t.val_every == 0 \
                and step != self.total_steps
            every = cfg.checkpoint.every_steps
            ckpt_due = every and step % every == 0 and step != self.total_steps
            # Finished right away when nothing is in flight to keep busy (a CPU run: the step is already done, and a
            # late close would time the next step instead), and before anything that reads the losses or syncs.
            if pending is not None and (pending.ready is None or val_due or ckpt_due or step == self.total_steps):
                last = self._finish_log(pending, meter, writer, progress)  # the checkpoint holds the losses
                pending = None
            if val_due:
                with meter.paused():
                    val_loss = self._validate(writer, step)
            if ckpt_due:
                with meter.paused():  # the save's blocking time is not a training step
                    self.save_checkpoint()

        profiler.finish(self.state.step)  # when training ended inside the traced steps
        if self.parts.val_set is not None:
            val_loss = self._validate(writer, self.state.step)
        self.save_checkpoint()
        if self.saver is not None:
            self.saver.wait()
        if progress is not None:
            progress.close()
        summary = {
            "steps": self.state.step, "epochs_started": self.state.epoch + (self.state.micro_in_epoch > 0),
            "final": {k: v for k, v in last.items()},
            "val_loss": val_loss,
            "median": meter.medians(),
            "perf_windows": meter.history,  # every logging window's figures but the first (start-up, compile)
            "perf_span_unix": meter.span_unix,  # when those windows ran: [start, end], Unix seconds
            # Each rank's GPU: medians over the logging windows but the first (compilation); empty without NVML.
            "gpus": {str(r): gpu_telemetry.medians(ws[1:] or ws) for r, ws in sorted(self.gpu_windows.items())},
            "time_to_first_step_s": first_step_s,
            "resumed_from": self.resumed_from,
            "losses": self.state.losses,
        }
        if writer is not None:
            writer.close()
        return summary

    def _finish_log(self, pending: _PendingLog, meter: metrics.StepMeter, writer: Any,
                    progress: Progress | None) -> dict[str, float]:
        """Wait for a log step's reduced values, then write its scalars and progress; return them."""
        train_loss, gnorm, gpus = pending.values()
        last = {"train/loss": train_loss, "lr": pending.lr, "grad_norm": gnorm,
                **meter.close_window(pending.window_steps), "memory/peak_gb": _peak_memory_gb(self.ctx.device)}
        self.state.losses.append(train_loss)
        for r, g in gpus.items():
            self.gpu_windows.setdefault(r, []).append(g)
        if writer is not None:
            for k, v in last.items():
                writer.add_scalar(k, v, pending.step)
            for r, g in gpus.items():
                for k, v in g.items():
                    writer.add_scalar(f"gpu{r}/{k}", v, pending.step)
        if progress is not None:
            progress.update(pending.step, train_loss, last.get("perf/tokens_per_s") or last["perf/samples_per_s"])
        return last

    def close(self) -> None:
        """Finish the checkpoint in flight and stop DataLoader worker processes now, not at interpreter exit."""
        if self.saver is not None:
            termination.forget(self.saver.finish)
            self.saver.close()
        if self.telemetry is not None:
            self.telemetry.close()
        self.loader = None  # persistent workers stop when their iterator is collected
        gc.collect()  # the LR lambda's closure makes a cycle through the trainer

    def _accumulate(self, loss: torch.Tensor, first: bool) -> None:
        """Backward of a micro-step that does not synchronise: its gradients go into ``p.grad`` in one foreach
        op instead of one op per parameter (148 launches for GPT-2 small, which leave the GPU idle between them
        when the rest of the step is CUDA graphs). The first micro-step of a step copies, later ones add."""
        grads = torch.autograd.grad(loss, self.params, allow_unused=True)
        used = [(p.grad, g) for p, g in zip(self.params, grads, strict=True) if g is not None]
        if first:
            torch._foreach_copy_([acc for acc, _ in used], [g for _, g in used])
            unused = [p.grad for p, g in zip(self.params, grads, strict=True) if g is None]
            if unused:  # a parameter this micro-batch did not reach: its gradient is zero, not last step's
                torch._foreach_zero_(unused)
        else:
            torch._foreach_add_([acc for acc, _ in used], [g for _, g in used])

    def _optimizer_step(self) -> tuple[float, torch.Tensor]:
        """Unscale (fp16), clip, step, advance the LR; returns the LR used and the grad norm (on the device)."""
        t = self.cfg.train
        lr = self.optimizer.param_groups[0]["lr"]
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
            grad_norm = (torch.nn.utils.clip_grad_norm_(self.params, t.grad_clip) if t.grad_clip
                         else torch.nn.utils.get_total_norm([p.grad for p in self.params]))
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:  # every trained parameter has its gradient buffer (see __init__)
            grad_norm = grad_sync.clipped_step(self.optimizer, self.params, t.grad_clip)
        if self.accumulation == 1 and self.ctx.world_size > 1:
            # The next step's only micro-step is a DDP backward, which adds into the buffers: they must be zero.
            # (Otherwise the first micro-step copies into them; see _accumulate.)
            self.optimizer.zero_grad(set_to_none=False)
        self.scheduler.step()
        return lr, grad_norm

    def _validate(self, writer: Any, step: int) -> float:
        data = self.parts.val_set
        cap = self.cfg.train.get("val_samples")
        if cap and cap < len(data):  # the same leading samples every time, each counted once
            data = Subset(data, range(cap))
        loss = evaluate(self.model, data, self.ctx, self.per_rank, self.cfg.train.precision)
        if writer is not None:
            writer.add_scalar("val/loss", loss, step)
        self._say(f"step {step} val/loss {loss:.4f}")
        return loss

    def _writer(self) -> Any:
        writer = self.writer_future.result()
        cfg = self.cfg
        gb = self.per_rank * self.ctx.world_size * self.accumulation
        plan = {"world_size": self.ctx.world_size, "per_rank_batch": self.per_rank,
                "accumulation": self.accumulation, "global_batch": gb}
        text = (f"global batch {gb} = {self.per_rank} per rank × {self.ctx.world_size} ranks × "
                f"{self.accumulation} accumulation\n\n| key | value |\n|---|---|\n"
                + "".join(f"| {k} | {v} |\n" for k, v in plan.items()))
        writer.add_text("plan", text, 0)
        hparams = {**plan, "task": cfg.task.name, "lr": cfg.train.lr, "precision": cfg.train.precision,
                   "device": cfg.device}
        from torch.utils.tensorboard.summary import hparams as hp

        for event in hp(hparams, {"train/loss": 0.0}):
            writer._get_file_writer().add_summary(event)
        return writer


def _open_writer(logdir: str) -> Any:
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(logdir)


def run(run_dir: str, local_dir: str, console: IO[str] | None) -> None:
    """Train this rank to the end, then report ``rank R device D completed``."""
    cfg = load_config(run_dir)
    writer_future = None
    if int(os.environ.get("RANK", "0")) == 0:
        # TensorBoard's import overlaps the process-group and DDP set-up instead of delaying the first step.
        writer_future = ThreadPoolExecutor(1).submit(_open_writer, os.path.join(local_dir, layout.TB))
    t0 = time.perf_counter()
    ctx = _setup(run_dir, local_dir, console, cfg)
    print(f"startup: process group ready in {time.perf_counter() - t0:.1f} s", flush=True)
    worker_io.write_json(local_dir, layout.rank_facts(ctx.rank), _facts(ctx, completed=False))
    failed = False
    try:
        trainer = Trainer(cfg, ctx, writer_future)
        trainer.maybe_resume()
        print(f"startup: task, model, DDP and data ready in {time.perf_counter() - t0:.1f} s", flush=True)
        summary = trainer.train()
        trainer.close()
        if ctx.device.type == "cuda":
            torch.cuda.synchronize()
        dist.barrier()
        line = f"rank {ctx.rank} device {_device_label(ctx)} completed"
        print(line, flush=True)
        worker_io.write_json(local_dir, layout.rank_facts(ctx.rank),
                             _facts(ctx, completed=True, exit_code=0, summary=summary if ctx.is_main else None))
    except BaseException as exc:  # noqa: B036 - the time of any failure, before the teardown below
        failed = True
        worker_io.mark_failure_time(exc)
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
