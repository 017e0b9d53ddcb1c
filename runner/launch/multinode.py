"""launcher=multinode: the same ``ddp-run`` on every host, joined by torchrun's c10d rendezvous.

Every node plans the same run from the same command line and so computes the same run directory,
``<output.root>/<rdzv_id>_<task>_w<world_size>`` (a root all nodes reach: a shared filesystem or an fsspec URL).
Node 0 (``launcher.node_rank=0``; with ``node_rank=null``, the host the rendezvous endpoint names) creates it, or
continues it when it already holds the run (a restart resumes from its newest checkpoint); every other node waits
until node 0's driver has opened it, then joins. Node 0's driver holds the run directory's lease (rundir/lease.py)
until it exits, so that a second node-0 driver of the same job is refused; the joining nodes take none. Node 0's
driver writes ``run.json`` and ``summary.json``, judging the run from every node's rank files; every
node's driver records its host, devices and outcome in ``nodes/<node>.json``, and a failed run names the node
that failed.

Its parts: the rendezvous and torchrun's command (multinode_rdzv.py), the shared run directory (multinode_rundir.py),
every node's record and the run judged from them (multinode_nodes.py); this module is the launcher itself and a
joining node's run.
"""

from __future__ import annotations

import socket
import sys
import time
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from ddp_runner.config.plan import Plan
from ddp_runner.contract import layout
from ddp_runner.contract.errors import PlanError
from ddp_runner.launch import node_story
from ddp_runner.launch.base import BaseLauncher, Job
from ddp_runner.launch.multinode_nodes import blame, collect, elastic_plan, gather, node_end, node_start, write_node
from ddp_runner.launch.multinode_rdzv import check, check_endpoint_free, command, env, node_name
from ddp_runner.launch.multinode_rundir import check_same_config, open_node0, run_url, wait_to_join
from ddp_runner.rundir.run_dir import RunDir
from ddp_runner.supervise import finalize


def follow(job: Job, rd: RunDir) -> int:
    """A node other than node 0: run this node's agent into the shared run directory, record its outcome in
    ``nodes/<node>.json`` and return the exit code. Node 0's driver writes run.json and summary.json."""
    from ddp_runner.rundir import run_dir as rundir
    from ddp_runner.supervise.session import Session, environment

    launcher, plan = job.launcher, job.plan
    node = node_name(launcher)
    cmd = command(plan, launcher, rd.url)
    record = node_start(plan, launcher, node, cmd)
    write_node(rd, node, record)
    print(f"ddp-run: node {node} joined {rd.url}", flush=True)
    # A remote root: this node's rank logs and facts are written locally and copied into the shared tree; on a
    # restart, whichever ranks land here append to their earlier lines (torchrun assigns them).
    staged = rundir.stage_logs(rd) if rd.is_remote else None
    variables = environment(rd, job.conf, plan, job.t0, job.task_dir, env(launcher))
    session = Session(rd, job.conf, plan, cmd, variables, agent_log=layout.node_agent_log(node), staged=staged,
                      relay=True)
    rc = session.run()
    session.close()
    write_node(rd, node, node_end(record, rc, session.interrupted))
    if session.interrupted is not None:
        return 128 + session.interrupted
    print(f"ddp-run: node {node}: torchrun exited with {rc}; node 0 writes the run's summary in {rd.url}",
          file=sys.stderr if rc else sys.stdout, flush=True)
    print(rd.url, flush=True)
    return 0 if rc == 0 else (rc if rc > 0 else 1)


class Multinode(BaseLauncher):
    """``launcher=multinode``: node 0 opens (or continues) the run directory and judges the run from every node's
    records; every other node joins it."""

    name = "multinode"

    def check(self, launcher: Mapping[str, Any], output_root: str) -> None:
        """See :func:`check`."""
        check(launcher)

    def command(self, plan: Plan, launcher: Mapping[str, Any], run_url: str) -> list[str]:
        """See :func:`command`."""
        return command(plan, launcher, run_url)

    def env(self, launcher: Mapping[str, Any]) -> dict[str, str]:
        """See :func:`env`."""
        return env(launcher)

    def open(self, job: Job) -> RunDir | None:
        """The run directory node 0 opens; None on the other nodes (they join it). Node 0 refuses a rendezvous
        port already in use (another job's) once it holds the run directory (the same job's second node 0 is
        refused by its lease, naming the driver), leaving nothing behind."""
        if job.rd is not None:
            return job.rd
        rd = open_node0(job.conf, job.plan)
        if rd is not None and job.launcher.get("node_rank") == 0:
            endpoint = str(job.launcher["rdzv_endpoint"])
            host, _, port = endpoint.rpartition(":")
            try:
                check_endpoint_free(host.strip("[]"), int(port), endpoint)
            except PlanError:
                if rd.continued:
                    if rd.lease is not None:
                        rd.lease.release()
                else:
                    rd.remove()
                raise
        return rd

    def join(self, job: Job) -> int:
        """Wait for node 0 to open the run directory, then run this node's ranks into it."""
        url = run_url(job.conf, job.plan)
        rd = wait_to_join(url, str(job.conf["output"]["root"]), job.launcher.get("join_timeout_s", 120))
        try:
            check_same_config(rd, job.written)
        except PlanError as err:  # node 0 learns why this node is missing from its record
            write_node(rd, node_name(job.launcher), {"node": node_name(job.launcher), "host": socket.gethostname(),
                                                     "status": "refused", "reason": f"{err.key}: {err.problem}",
                                                     "ended": datetime.now().isoformat(timespec="seconds"),
                                                     "torchrun_exit_code": 2})
            raise
        return follow(job, rd)

    def launch(self, job: Job, rd: RunDir, manifest: dict[str, Any]) -> int:
        """Node 0: this node's ranks under the judging session, then the run judged from every node's records."""
        if job.rd is not None:  # resume=<run dir>: that run is continued from this host alone
            return super().launch(job, rd, manifest)
        from ddp_runner.config.plan import node_range

        launcher = job.launcher
        node = node_name(launcher)
        record = node_start(job.plan, launcher, node, manifest["command"])
        write_node(rd, node, record)
        session = self.session(job, rd, manifest["command"], manifest, staged=job.staged,
                               agent_log=layout.node_agent_log(node), peers=True)
        launched = time.time()
        rc = session.run()
        if session.lease_lost:
            return 1
        write_node(rd, node, node_end(record, rc, session.interrupted))
        nodes = collect(rd, node_range(job.conf)[0])
        try:  # a remote root: the other nodes' ranks wrote their facts on their own hosts, mirrored since
            gather(rd, launched)
        except Exception as exc:  # noqa: BLE001 - judged then from this node's ranks alone: said, not raised
            print(f"ddp-run: warning: could not read the other nodes' rank files from {rd.url}: {exc}",
                  file=sys.stderr, flush=True)
        plan = elastic_plan(rd, job.plan, launcher)
        code = finalize.finish(rd, manifest, plan, rc, session.interrupted, watch=session.observations(),
                                preempt=session.preempt, lost=node_story.stop_cause(nodes, session.interrupted))
        blame(rd, manifest, nodes, session.interrupted)
        session.close()
        print(rd.url, flush=True)
        return code


LAUNCHER = Multinode()
