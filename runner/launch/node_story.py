"""What happened to a multi-node run's nodes, told from their records on node 0 after its finalisation: a node
whose driver was lost (its record has no end), and the last step each rank reached.

A node's ``ddp-run`` killed (SIGKILL of a pod's PID 1, a host lost) takes its torchrun agent down with SIGTERM (the
agent's parent-death signal), and with ``checkpoint.stop_signal=SIGTERM`` (Kubernetes' pods) every rank takes that
as the stop: the run ends ``preempted`` with a checkpoint although nothing sent a pod SIGTERM. These lines say so.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ddp_runner.contract import layout


def lost_nodes(nodes: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The nodes whose driver recorded no end: it (or its host, or its pod) was lost."""
    return sorted((n for n, r in nodes.items() if "ended" not in r), key=lambda n: (len(n), n))


def last_steps(progress: Mapping[int, Mapping[str, Any]]) -> dict[int, int | None]:
    """The last step each rank reported (its progress record), by rank."""
    return {r: p.get("step") for r, p in sorted(progress.items())}


def steps_text(progress: Mapping[int, Mapping[str, Any]]) -> str:
    """``rank 0 after step 7 (log), rank 1 after step 6 (sync)``."""
    return ", ".join(f"rank {r} after step {p.get('step')} ({p.get('phase')})" for r, p in sorted(progress.items()))


def lines(nodes: Mapping[str, Mapping[str, Any]], status: str, interrupted: int | None,
          progress: Mapping[int, Mapping[str, Any]]) -> list[str]:
    """The console's lines about a lost peer node (none when every node's driver recorded its end, or when this
    driver itself was stopped)."""
    lost = lost_nodes(nodes)
    if not lost or interrupted is not None:
        return []
    names = ", ".join(f"node {n} (host {nodes[n].get('host')})" for n in lost)
    steps = f"; last step reached: {steps_text(progress)}" if progress else ""
    if status in (layout.STATUS_PREEMPTED, layout.STATUS_INTERRUPTED):
        return [f"ddp-run: a peer node was lost: {names} recorded no end (its ddp-run, pod or host was killed);"
                " its torchrun agent stopped that node's ranks with SIGTERM as it went, which every rank took as"
                f" the stop: this pod's ddp-run was sent no signal{steps}"]
    if status == layout.STATUS_FAILED:
        return [f"ddp-run: a peer node was lost: {names} recorded no end (its ddp-run, pod or host was killed){steps}"]
    return []
