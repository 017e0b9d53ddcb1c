"""The per-step stop vote (tasks/engine/stop/vote.py) on real gloo ranks: a stop that one rank received, by signal or by
the driver's request file, is seen by every rank at the same step; no stop, no rank stops."""

from __future__ import annotations

import json
import os
import signal

import torch
import torch.distributed as dist

from ddp_runner.tasks.engine.stop import signals as termination
from ddp_runner.tasks.engine.stop import vote as stop_vote
from tests.support.spawn import spawn


def _worker(rank: int, world: int, store: str, out: str, request: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        vote = stop_vote.StopAgreement(torch.device("cpu"), request_file=request if rank == 0 else None)
        answers = []
        for step in range(1, 9):
            if rank == 1 and step == 3:  # what the watcher thread records when SIGTERM reaches this rank
                termination._requested = signal.SIGTERM  # noqa: SLF001 - the flag, set as the signal would
            if rank == 0 and step == 6:
                with open(request, "w") as f:
                    json.dump({"signal": int(signal.SIGUSR2)}, f)
                vote._looked = 0.0  # noqa: SLF001 - look at once, not a second later
            answers.append(vote.poll())
            if rank == 1 and step == 4:
                termination._requested = 0  # noqa: SLF001
        torch.save({"answers": answers, "stats": vote.stats()}, f"{out}-{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_every_rank_sees_a_stop_at_the_same_step(tmp_path):
    out, request = str(tmp_path / "votes"), str(tmp_path / "stop-request.json")
    spawn(_worker, args=(2, str(tmp_path / "store"), out, request))
    got = [torch.load(f"{out}-{r}.pt") for r in range(2)]
    want = [0, 0, 15, 15, 0, 12, 12, 12]  # rank 1's SIGTERM at steps 3-4; the request file from step 6 on
    assert got[0]["answers"] == got[1]["answers"] == want
    assert got[0]["stats"]["polls"] == 8 and got[0]["stats"]["mean_us"] > 0
    assert stop_vote.StopAgreement(torch.device("cpu"), enabled=False).poll() == 0
    assert os.path.exists(request)
