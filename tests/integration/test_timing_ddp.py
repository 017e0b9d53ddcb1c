"""Where each step's time goes (tasks/engine/timing.py): phase arithmetic, the CPU timer, the slowest/fastest rank,
the words the console and ddp-compare make of it, and DDP's last-bucket notice on real gloo."""

from __future__ import annotations

import gc

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_runner.tasks.engine.strategy import grad_sync
from tests.support.spawn import spawn


def _ddp_worker(rank: int, store: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(*(torch.nn.Linear(256, 256) for _ in range(4)))
        ddp = DDP(model, bucket_cap_mb=0.3)  # several buckets: the notice comes once, for the last
        calls: list[int] = []    # hook calls in the current backward
        seen: list[int] = []     # how many hook calls there had been when the notice came
        per_backward: list[int] = []
        hook = grad_sync.notify_last_bucket(grad_sync.mean_allreduce_hook, lambda: seen.append(len(calls)))

        def counting(state, bucket):  # unannotated: DDP checks real annotations, this file has string ones
            calls.append(bucket.index())
            return hook(state, bucket)

        ddp.register_comm_hook(None, counting)
        for _ in range(3):
            calls.clear()
            ddp(torch.randn(8, 256)).sum().backward()
            per_backward.append(len(calls))
        torch.save({"per_backward": per_backward, "seen": seen}, f"{out}.{rank}")
        del ddp
        gc.collect()
    finally:
        dist.destroy_process_group()


def test_ddp_notifies_once_per_backward_when_the_last_bucket_is_ready(tmp_path):
    out = str(tmp_path / "r")
    spawn(_ddp_worker, args=(str(tmp_path / "store"), out))
    r = torch.load(f"{out}.0")
    assert max(r["per_backward"]) >= 2, r  # several buckets (once DDP has rebuilt them after the first backward)
    # Notified once per backward, at its last hook call (every earlier bucket already launched).
    assert r["seen"] == r["per_backward"], r
