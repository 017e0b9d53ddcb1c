"""launcher=local: one host, torchrun with a c10d rendezvous on 127.0.0.1.

``torchrun --standalone`` would do the same, but its store listens on every interface, and torch.distributed
trusts whoever connects. Here the rendezvous endpoint, the node's own address (the workers' MASTER_ADDR) and the
stores' listening sockets are all on the loopback interface, and gloo/NCCL are pointed at it too (``env``).
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Mapping
from typing import Any

from ddp_runner.config.plan import Plan
from ddp_runner.launch import forkserver
from ddp_runner.launch.base import BaseLauncher

LOOPBACK = "127.0.0.1"


def agent_prefix() -> list[str]:
    """How every launcher starts torchrun's agent (with bound stores). ``-P``: as for the workers, a stray
    ``runner.py`` in the user's working directory must not shadow this package."""
    return [sys.executable, "-P", "-m", "ddp_runner.launch.agent"]


def worker_tail(run_url: str) -> list[str]:
    """What torchrun runs on every rank (the agent runs it as forks of a preloaded server: forkserver.py)."""
    return forkserver.worker_tail(run_url)


def command(plan: Plan, launcher: Mapping[str, Any], run_url: str) -> list[str]:
    """The torchrun invocation of a one-host run. Port 0: the store takes a free port itself (no race)."""
    return [*agent_prefix(), "--nnodes=1", "--rdzv-backend=c10d", f"--rdzv-endpoint={LOOPBACK}:0",
            f"--rdzv-id={uuid.uuid4().hex[:12]}", f"--local-addr={LOOPBACK}",
            f"--nproc-per-node={plan.nproc_per_node}", f"--max-restarts={launcher.get('max_restarts', 0)}",
            *worker_tail(run_url)]


def loopback_interface() -> str | None:
    """The name of the loopback interface (``lo`` on Linux, ``lo0`` on macOS), None if there is none."""
    import psutil

    for name, addrs in psutil.net_if_addrs().items():
        if any(a.address == LOOPBACK for a in addrs):
            return name
    return None


def env() -> dict[str, str]:
    """Variables that keep the collectives' own listening sockets on loopback (unless the user set them)."""
    lo = loopback_interface()
    return {"GLOO_SOCKET_IFNAME": lo, "NCCL_SOCKET_IFNAME": lo} if lo else {}


class Local(BaseLauncher):
    """``launcher=local``: one host, everything on loopback."""

    name = "local"

    def command(self, plan: Plan, launcher: Mapping[str, Any], run_url: str) -> list[str]:
        """See :func:`command`."""
        return command(plan, launcher, run_url)

    def env(self, launcher: Mapping[str, Any]) -> dict[str, str]:
        """See :func:`env`."""
        return env()


LAUNCHER = Local()
