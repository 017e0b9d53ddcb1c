"""The in-process gloo tests' rank processes: forked from one server per test process that imported torch (and
torch._dynamo, which DDP's constructor imports) once, instead of two fresh interpreters per test importing them
again."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from typing import Any

import torch.multiprocessing as mp

PRELOAD = ["torch", "torch._dynamo", "torch.distributed", "torch.nn.parallel"]


def spawn(fn: Callable[..., Any], args: tuple = (), nprocs: int = 2) -> None:
    """``torch.multiprocessing.spawn(fn, args, nprocs, join=True)``, with the processes forked from the preloaded
    server (started on first use; a failure in any process raises here, as with spawn)."""
    multiprocessing.set_forkserver_preload(PRELOAD)
    mp.start_processes(fn, args=args, nprocs=nprocs, join=True, start_method="forkserver")
