"""What happened to a multi-node run's nodes, told from their records on node 0: a node whose driver was lost (its
record has no end), and the last step each rank reached.

A node's ``ddp-run`` killed (SIGKILL of a pod's PID 1, a host lost) takes its torchrun agent down with SIGTERM (the
agent's parent-death signal), which every rank takes as the stop: the run ends with a checkpoint although nothing
sent this node's driver a signal. :func:`stop_cause` gives node 0's finalisation the words for that stop's headline
(runner/supervise/stop/outcome.py); :func:`lines` says the same of a failure that a lost node caused.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ddp_runner.contract import layout
from ddp_runner.diagnostics.rootcause import least_step


def lost_nodes(nodes: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The nodes whose driver recorded no end: it (or its host, or its pod) was lost."""
    return sorted((n for n, r in nodes.items() if "ended" not in r), key=lambda n: (len(n), n))


def last_steps(progress: Mapping[int, Mapping[str, Any]]) -> dict[int, int | None]:
    """The last step each rank reached, by rank: its progress record's, or more where the other ranks' records
    show that it completed more (a lost node's last copy in an object store trails: rootcause.least_step)."""
    return {r: (bound[0] if (bound := least_step(progress, r)) else p.get("step")) for r, p in sorted(progress.items())}


def steps_text(progress: Mapping[int, Mapping[str, Any]]) -> str:
    """``rank 0 after step 7 (log), rank 1 after at least step 6 (its last record: step 2, sync)``."""
    def one(r: int, p: Mapping[str, Any]) -> str:
        if (bound := least_step(progress, r)) is None:
            return f"rank {r} after step {p.get('step')} ({p.get('phase')})"
        return f"rank {r} after at least step {bound[0]} (its last record: step {p.get('step')}, {p.get('phase')})"

    return ", ".join(one(r, p) for r, p in sorted(progress.items()))


def _named(nodes: Mapping[str, Mapping[str, Any]], lost: list[str]) -> str:
    return ", ".join(f"node {n} (host {nodes[n].get('host')})" for n in lost)


def stop_cause(nodes: Mapping[str, Mapping[str, Any]], interrupted: int | None) -> str | None:
    """What stopped the ranks when this driver was sent no signal (``interrupted`` None) and a peer node's driver
    recorded no end: ``node 1 (host b) was lost (…)``, for the stop's headline; None otherwise (the stop was this
    driver's, or every node's driver ended: a stop of its own)."""
    lost = lost_nodes(nodes)
    if not lost or interrupted is not None:
        return None
    verb = "was" if len(lost) == 1 else "were"
    return (f"{_named(nodes, lost)} {verb} lost (its driver recorded no end: its ddp-run, pod or host was killed);"
            " its torchrun agent stopped that node's ranks with SIGTERM as it went")


def lines(nodes: Mapping[str, Mapping[str, Any]], status: str, interrupted: int | None,
          progress: Mapping[int, Mapping[str, Any]]) -> list[str]:
    """The console's line about a lost peer node behind a failure, with the last step each rank reached (none when
    every node's driver recorded its end, when this driver itself was stopped, or for a stop: its headline says
    so, :func:`stop_cause`)."""
    lost = lost_nodes(nodes)
    if not lost or interrupted is not None or status != layout.STATUS_FAILED:
        return []
    steps = f"; last step reached: {steps_text(progress)}" if progress else ""
    return [f"ddp-run: a peer node was lost: {_named(nodes, lost)} recorded no end (its ddp-run, pod or host was"
            f" killed){steps}"]
