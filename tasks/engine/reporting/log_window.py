"""What rank 0 writes while training: TensorBoard scalars, the plan as text and hparams, and the pending log step
whose values travel to the host without stalling the GPU."""

from __future__ import annotations

import math
import resource
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import yaml

from ddp_runner.contract.rules import explain
from ddp_runner.tasks.engine import timing
from ddp_runner.tasks.engine.config import read_manifest
from ddp_runner.tasks.engine.diagnostics import telemetry as gpu_telemetry


def peak_memory_gb(device: torch.device) -> float:
    """Peak allocated device memory (CUDA), or the process's peak RSS (CPU), in GiB."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB (peak RSS)


@dataclass
class PendingLog:
    """A log step's loss, grad norm, GPU telemetry and phase times from every rank, gathered and on their way to
    the host without a sync."""

    step: int
    host: torch.Tensor            # (world, 2 + telemetry + timing + stop vote + extras); valid once ``ready`` is done
    ready: torch.cuda.Event | None
    lr: float
    window_steps: int             # optimizer steps of the perf window that ends with this step
    n_extra: int = 0              # the task's extra metrics, last in each row (tasks/engine/reporting/task_metrics.py)
    known: dict[str, float] = field(default_factory=dict)  # scalars known on the host at the step, logged as they are

    @classmethod
    def start(cls, step: int, mean_loss: torch.Tensor, grad_norm: torch.Tensor, lr: float, window_steps: int,
              world_size: int, gpu: dict[str, float] | None = None,
              times: dict[str, float] | None = None, stop: int = 0,
              extra: torch.Tensor | None = None) -> PendingLog:
        """Gather this step's values from every rank (one small collective) and start their copy to the host.
        ``stop``: this rank's stop vote (a signal number, 0: none), carried in the same collective; ``extra``: the
        task's extra metrics, last in each row."""
        # The logged loss is the global mean over the whole global batch, and rank 0 logs every rank's GPU.
        # Every rank sends the same length (NaN where it has no telemetry), so ranks that disagree about NVML
        # cannot mismatch the collective.
        dev = mean_loss.device
        tele = torch.tensor([math.nan if gpu is None else gpu[k] for k in gpu_telemetry.FIELDS]
                            + [math.nan if times is None else times[k] for k in timing.FIELDS] + [float(stop)])
        if dev.type == "cuda":  # from pinned memory, without a sync: a blocking copy would drain the GPU's queue
            tele = tele.pin_memory().to(dev, non_blocking=True)
        extra = torch.zeros(0, device=dev) if extra is None else extra.float().to(dev)
        stats = torch.cat([torch.stack([mean_loss, grad_norm.detach().float().to(dev)]), tele, extra])
        gathered = stats.new_empty(world_size * stats.numel())
        dist.all_gather_into_tensor(gathered, stats)
        gathered = gathered.view(world_size, -1)
        if dev.type != "cuda":
            return cls(step, gathered, None, lr, window_steps, extra.numel())
        host = torch.empty(gathered.shape, pin_memory=True)
        host.copy_(gathered, non_blocking=True)
        ready = torch.cuda.Event()
        ready.record()
        return cls(step, host, ready, lr, window_steps, extra.numel())

    def values(self) -> tuple[float, float, dict[int, dict[str, float]], dict[int, dict[str, float]]]:
        """Mean loss and grad norm over the ranks, each rank's GPU telemetry and each rank's phase times (ms) where
        it has some (waits for the copy)."""
        if self.ready is not None:
            self.ready.synchronize()
        loss, gnorm = self.host[:, :2].mean(dim=0).tolist()
        n = len(gpu_telemetry.FIELDS)
        gpus = {r: dict(zip(gpu_telemetry.FIELDS, row[2:2 + n].tolist(), strict=True))
                for r, row in enumerate(self.host) if not math.isnan(row[2].item())}
        m = 2 + n + len(timing.FIELDS)
        times = {r: dict(zip(timing.FIELDS, row[2 + n:m].tolist(), strict=True))
                 for r, row in enumerate(self.host) if not math.isnan(row[2 + n].item())}
        return loss, gnorm, gpus, times

    def stop_vote(self) -> int:
        """The stop every rank agreed on through this log step's gather (MAX of the votes; 0: none). Call after
        :meth:`values` (which waits for the copy)."""
        m = 2 + len(gpu_telemetry.FIELDS) + len(timing.FIELDS)
        return int(self.host[:, m].max().item())

    def extra_means(self) -> list[float]:
        """The task's extra metrics, each the mean over the ranks (call after :meth:`values`)."""
        if not self.n_extra:
            return []
        return self.host[:, self.host.shape[1] - self.n_extra:].double().mean(dim=0).tolist()


def swept_values(run_dir: str) -> dict[str, Any]:
    """This sweep job's value of each swept key, as the driver recorded them in run.json (typed as YAML reads
    them: ``0.1`` a number); empty outside a sweep or when run.json cannot be read."""
    swept = (read_manifest(run_dir).get("invocation") or {}).get("swept") or {}
    out: dict[str, Any] = {}
    for k, v in swept.items():
        try:
            value = yaml.safe_load(v)
        except yaml.YAMLError:
            value = v
        out[k] = value if isinstance(value, (int, float, str, bool)) else str(v)  # what HPARAMS can show
    return out


def open_writer(logdir: str) -> Any:
    """A TensorBoard SummaryWriter (imported here: the import is slow, so callers run this in a thread)."""
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(logdir)


def purge_from(writer: Any, step: int) -> None:
    """What ``SummaryWriter(purge_step=step)`` does, once the step is known (a resume's): TensorBoard drops the
    points at ``step`` and later that earlier event files hold, so an interrupted attempt's steps after its last
    checkpoint are not shown twice."""
    from tensorboard.compat.proto.event_pb2 import Event, SessionLog

    writer.file_writer.add_event(Event(step=step, session_log=SessionLog(status=SessionLog.START)))


# The scalars the HPARAMS tab shows beside each run's settings (their latest values).
HPARAM_METRICS = ("train/loss", "val/loss", "perf/step_time_s", "perf/samples_per_s", "perf/tokens_per_s")
# batch.per_rank=auto: the micro-batch of each logged step (its last value is the fitted one; the plan and hparams,
# written when the loop starts, hold the launch's start).
MICRO_BATCH = "batch/micro"


def write_plan(writer: Any, plan: dict[str, int], hparams: dict[str, Any], tokens: bool = True,
               micro: bool = False) -> None:
    """The plan as a TEXT entry and the run's settings in the HPARAMS tab, so the global batch sits beside the
    curves; loss, step time and throughput are the tab's metrics (tokens/s only for a task with tokens), and with
    ``micro`` (``batch.per_rank=auto``) the fitted micro-batch: the plan here is the one the launch started at."""
    text = (explain(plan["global_batch"], plan["per_rank_batch"], plan["world_size"], plan["accumulation"])
            + "\n\n| key | value |\n|---|---|\n" + "".join(f"| {k} | {v} |\n" for k, v in plan.items()))
    writer.add_text("plan", text, 0)
    from torch.utils.tensorboard.summary import hparams as hp

    metrics = {k: 0.0 for k in (*HPARAM_METRICS, *([MICRO_BATCH] if micro else ()))
               if tokens or k != "perf/tokens_per_s"}
    for event in hp({**plan, **hparams}, metrics):
        writer._get_file_writer().add_summary(event)
