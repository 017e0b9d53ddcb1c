"""A run directory that two gloo ranks left failed, built by hand (no launch): rank 1 erred first, rank 0 a second
later with the same error, for the tests of a failed run's closing account."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from fsspec.implementations.local import LocalFileSystem

from ddp_runner.config.plan import Plan
from ddp_runner.contract import layout
from ddp_runner.rundir.run_dir import RunDir

PLAN = Plan(world_size=2, per_rank_batch=8, accumulation=1, global_batch=16, device="cpu", backend="gloo", nnodes=1,
            nproc_per_node=2)


def two_ranks_failed(run: Path, message: str, traceback: Sequence[str], where: str) -> tuple[RunDir, Plan]:
    """``run`` with both ranks' error records (``message``, ``traceback``, ``where``), as finalisation reads it."""
    (run / layout.PROGRESS).mkdir(parents=True)
    for rank, t in ((1, 10.0), (0, 11.0)):
        (run / layout.rank_error(rank)).write_text(json.dumps({
            "rank": rank, "time": 1_760_000_000.0 + t, "type": "TypeError", "message": message,
            "traceback": list(traceback), "where": where}))
    return RunDir(url=str(run), local=str(run), fs=LocalFileSystem(), path=str(run)), PLAN
