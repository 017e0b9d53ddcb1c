"""One supervision session, whatever the launcher: worker environment → diagnostics → supervisor → mirror →
watchdog → ticks → tidy. Every launcher runs its torchrun through it: a local run, node 0 and the other nodes of
a multi-node run, and the driver of a Slurm job.

The *judging* session (a manifest is given) also refreshes the driver's heartbeat in run.json and runs the hang
watchdog: exactly one per run. Another node's session mirrors its ranks' files and relays node 0's dump request.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ddp_runner.config.plan import Plan
from ddp_runner.console import sweep_view, textfit
from ddp_runner.console.live import Live
from ddp_runner.console.live import wanted as live_wanted
from ddp_runner.contract import layout, stops
from ddp_runner.diagnostics import setup
from ddp_runner.diagnostics.peers import PeerRanks, Relay
from ddp_runner.diagnostics.watchdog import Watchdog
from ddp_runner.rundir.heartbeat import Heartbeat
from ddp_runner.rundir.mirror import Mirror
from ddp_runner.rundir.run_dir import RunDir
from ddp_runner.supervise.supervisor import Supervisor, worker_env


def environment(rd: RunDir, conf: Mapping[str, Any], plan: Plan, t0: float, task_dir: str | None,
                extra: Mapping[str, str]) -> dict[str, str]:
    """What torchrun and its workers get: the run directory's names, the launcher's ``extra`` variables (where
    the user has not set them) and the diagnostics' (flight recorder, debug)."""
    env = worker_env(rd.url, rd.local, t0, restarts=conf["launcher"].get("max_restarts", 0), task_path=task_dir,
                     extra=extra)
    env.update(setup.worker_env(conf, plan.backend))
    return env


def lease_tick(held: Any) -> Callable[[], None]:
    """The supervisor's tick for the run directory's lease: renew it; once it is lost, stop the workers (SIGTERM
    to this driver, handled as Ctrl-C is) so that only the new holder writes the directory."""

    def tick() -> None:
        if held is None or held.lost:
            return
        held.refresh()
        if held.lost:
            os.kill(os.getpid(), signal.SIGTERM)

    return tick


def live_bar(rd: RunDir, conf: Mapping[str, Any], plan: Plan, env: dict[str, str], in_turn: bool = False,
             ) -> Live | None:
    """The live bar when the driver's stdout is a terminal (its path added to ``env`` for rank 0), else None.
    ``in_turn``: a job of a sweep run in turn, whose rank 0 records its console in the run directory whatever the
    console, under a bar that is gone when the job ends (its one closing line stays)."""
    env.pop(layout.ENV_CONSOLE_RECORDS, None)  # never inherited from the user's environment
    if plan.nnodes == 1 and (view := os.environ.get(layout.ENV_SWEEP_CONSOLE)):
        env[layout.ENV_CONSOLE_RECORDS] = view  # a job of a concurrent sweep: the sweep's view draws it
        return None
    # One host only: on several, rank 0 may be another node's (torchrun assigns group ranks as nodes join), and
    # that node's rank 0 writes plain lines on its own console.
    if plan.nnodes != 1:
        return None
    if in_turn:
        env[layout.ENV_CONSOLE_RECORDS] = str(Path(rd.local, layout.CONSOLE_RECORDS))
    if not live_wanted(sys.stdout):
        return None
    ranks = f"{plan.world_size} rank{'s' if plan.world_size != 1 else ''}"
    bar = Live.for_run(rd.local, f"{conf['task']['name']} · {ranks}", transient=in_turn)
    env[layout.ENV_CONSOLE_RECORDS] = bar.path
    return bar


class Session:
    """torchrun under supervision for one run directory, with everything that watches it.

    ``manifest``: this session judges the run (heartbeat and watchdog); None for another node's session.
    ``agent_log``: torchrun's log, relative to the run tree. ``staged``: what a remote tree holds already (see
    :class:`~ddp_runner.rundir.mirror.Mirror`). ``peers``: read the other nodes' mirrored ranks too (multi-node run
    under a remote root). ``relay``: another node of a remote run: pass node 0's dump request to this node's ranks.
    ``stop_by_file``: a stop asks rank 0 through ``layout.STOP_REQUEST`` before any signal (Slurm: a signal to
    srun cancels the step).
    """

    def __init__(self, rd: RunDir, conf: Mapping[str, Any], plan: Plan, cmd: list[str], env: dict[str, str], *,
                 agent_log: str = layout.AGENT_LOG, manifest: dict[str, Any] | None = None,
                 staged: dict[str, tuple[int, int]] | None = None, peers: bool = False, relay: bool = False,
                 stop_by_file: bool = False) -> None:
        self.rd, self.plan, self.judging = rd, plan, manifest is not None
        # On a shared filesystem another node's folders are node 0's: only the judge (or a node with its own
        # staging folder) makes them.
        if self.judging or rd.is_remote:
            setup.prepare(rd.local, conf)
        # The judge draws rank 0's progress on a terminal (its workers then record their console for it).
        env.pop(layout.ENV_CONSOLE_RECORDS, None)
        in_turn = sweep_view.in_turn((manifest or {}).get("invocation", {}).get("sweep"), conf)
        self.live = live_bar(rd, conf, plan, env, in_turn) if manifest is not None else None
        self.preempt, grace_s = stops.of(conf.get("checkpoint"))
        self.supervisor = Supervisor(cmd, env, str(Path(rd.local, agent_log)), self.preempt, grace_s,
                                     str(Path(rd.local, layout.STOP_REQUEST)) if stop_by_file else None)
        self.mirror = Mirror(rd, staged=staged) if rd.is_remote else None
        self.watch: Watchdog | None = None
        self.ticks: list[Callable[[], None]] = []
        if manifest is not None:
            peer_ranks = None
            if peers and rd.is_remote:  # the other nodes' ranks write on their own disks: read their copies
                peer_ranks = PeerRanks(rd)
                peer_ranks.reset()
            timeout = float((conf.get("watchdog") or {}).get("timeout_s") or 0)
            self.watch = Watchdog(rd.local, rd.url, plan.world_size, timeout, lambda: self.supervisor.proc,
                                  nccl=plan.backend == "nccl", peers=peer_ranks)
            self.ticks += [Heartbeat(rd, manifest).tick, self.watch.tick]
        if self.mirror is not None:
            self.ticks.append(self.mirror.tick)
            if relay:
                self.ticks.append(Relay(rd, self.mirror).tick)
        self.ticks.append(lease_tick(rd.lease))
        if self.live is not None:
            self.ticks.append(self.live.tick)

    @property
    def interrupted(self) -> int | None:
        """The signal that stopped the run (Ctrl-C, SIGTERM to the driver), or None."""
        return self.supervisor.interrupted

    @property
    def lease_lost(self) -> bool:
        """Did another driver take this run directory over while it ran?"""
        return self.rd.lease is not None and self.rd.lease.lost

    def run(self) -> int:
        """Run torchrun to its end and return its exit code (negative for a signal). On a lost lease nothing
        more is touched: the directory is the new holder's."""
        if self.live is not None:
            self.live.start()
        try:
            rc = self.supervisor.run(on_tick=lambda: [tick() for tick in self.ticks])
        finally:
            if self.live is not None:  # the terminal is the driver's again before anything else is printed
                self.live.stop()
        if self.lease_lost:
            textfit.say(f"ddp-run: FAILED: lost the lease on {self.rd.url} to another driver; run.json left to it",
                        sys.stderr, flush=True)
            return rc
        if self.watch is not None:
            self.watch.tick(judge=False)  # processes that ended since the last tick
        if self.judging or self.mirror is not None:
            setup.tidy(self.rd.local)
        return rc

    def observations(self) -> dict[str, Any] | None:
        """What the watchdog saw (a hang, OOM kills), for the summary."""
        return self.watch.observations() if self.watch is not None else None

    def close(self) -> None:
        """Give the lease back and make the last copy into a remote tree."""
        if self.rd.lease is not None:
            self.rd.lease.release()
        if self.mirror is not None:
            self.mirror.flush()
            if (line := self.mirror.left_behind()) is not None:
                textfit.say(line, sys.stderr, flush=True)
