"""launcher=multinode's nodes: every node's record (``nodes/<node>.json``: host, devices, outcome), node 0
collecting them and the other nodes' rank files, the plan as an elastic job ran it, and the node a failure started
on.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import time
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from ddp_runner.config.plan import Plan
from ddp_runner.contract import layout
from ddp_runner.contract.rules import global_batch
from ddp_runner.launch.multinode_rundir import POLL_S
from ddp_runner.rundir.run_dir import RunDir

# After its own agent ends, how long node 0 waits for the other nodes' drivers to record their end.
NODES_GRACE_S = 30.0


def devices_record(plan: Plan) -> list[dict[str, Any]]:
    """This node's devices: the visible GPUs its ranks use, or CPU."""
    if plan.gpus:
        return [{"local_rank": i, "physical_index": g.physical_index, "name": g.name, "uuid": g.uuid}
                for i, g in enumerate(plan.gpus)]
    return [{"local_rank": i, "name": "cpu"} for i in range(plan.nproc_per_node)]


def write_node(rd: RunDir, node: str, record: dict[str, Any]) -> None:
    """Write this node's record ``nodes/<node>.json``."""
    rd.write_json(layout.node_record(node), record)


def node_start(plan: Plan, launcher: Mapping[str, Any], node: str, cmd: list[str]) -> dict[str, Any]:
    """This node's record as it starts."""
    return {"node": node, "node_rank": launcher.get("node_rank"), "host": socket.gethostname(),
            "pid": os.getpid(), "started": datetime.now().isoformat(timespec="seconds"),
            "nproc_per_node": plan.nproc_per_node, "devices": devices_record(plan), "command": cmd,
            "agent_log": layout.node_agent_log(node), "status": layout.STATUS_RUNNING}


def node_end(record: dict[str, Any], rc: int, interrupted: int | None) -> dict[str, Any]:
    """This node's record once its agent has ended."""
    ended = (layout.STATUS_INTERRUPTED if interrupted is not None
             else layout.STATUS_COMPLETED if rc == 0 else layout.STATUS_FAILED)
    return {**record, "ended": datetime.now().isoformat(timespec="seconds"), "torchrun_exit_code": rc,
            "status": ended}


def collect(rd: RunDir, nnodes: int, grace_s: float = NODES_GRACE_S) -> dict[str, dict[str, Any]]:
    """Every node's record, once each has ended (or ``grace_s`` has passed: a node whose driver never says so
    is recorded as it last was)."""
    import fsspec

    fs, path = fsspec.core.url_to_fs(rd.url)
    deadline = time.monotonic() + grace_s
    while True:
        fs.invalidate_cache()
        nodes: dict[str, dict[str, Any]] = {}
        for f in fs.glob(layout.join(path, layout.NODES, "*.json")):
            try:
                rec = json.loads(fs.cat_file(f))
            except (OSError, ValueError):
                continue
            nodes[str(rec.get("node"))] = rec
        done = len(nodes) >= nnodes and all("ended" in r for r in nodes.values())
        if done or time.monotonic() > deadline:
            return nodes
        time.sleep(POLL_S)


def gather(rd: RunDir, since: float) -> int:
    """Node 0 under a remote root (``s3://``…): copy into this driver's staging directory the rank files and logs
    that the other nodes' drivers mirrored to the shared tree, so that completion, the summary and the root cause
    are judged from every rank, not only this node's. Returns how many files were copied.

    A local file written since ``since`` (this node's launch) is this node's own and kept; an older one (staged
    from an earlier attempt by a restart) is replaced by the shared tree's, which its node has just mirrored.
    Call it after :func:`collect`: each node's driver mirrors its files before it records its end.
    """
    if not rd.is_remote:
        return 0  # a shared filesystem: every node's ranks wrote into this very directory
    logs = layout.join(rd.path, layout.LOGS)
    rd.fs.invalidate_cache()
    copied = 0
    for remote in rd.fs.find(logs):
        rel = remote[len(logs):].lstrip("/")
        target = os.path.join(rd.local, layout.LOGS, *rel.split("/"))
        if not rel or ".tmp" in rel or (os.path.exists(target) and os.path.getmtime(target) >= since):
            continue
        os.makedirs(os.path.dirname(target), exist_ok=True)
        rd.fs.get_file(remote, target)
        copied += 1
    return copied


def elastic_plan(rd: RunDir, plan: Plan, launcher: Mapping[str, Any]) -> Plan:
    """With an elastic range (``launcher.nnodes=min:max``) the job may run on fewer nodes than the plan's maximum:
    the plan as it ran (world size and global batch from the ranks that reported), for finalisation."""
    import dataclasses
    import glob

    if ":" not in str(launcher.get("nnodes", "")):
        return plan
    ranks = ranks_that_ran(glob.glob(os.path.join(rd.local, layout.LOGS, "rank*.json")))
    if not 0 < ranks < plan.world_size:
        return plan
    print(f"ddp-run: elastic: the job ran {ranks} of at most {plan.world_size} ranks"
          f" ({ranks // plan.nproc_per_node} of {plan.nnodes} nodes)", flush=True)
    return dataclasses.replace(plan, world_size=ranks, nnodes=ranks // plan.nproc_per_node,
                               global_batch=global_batch(plan.per_rank_batch, ranks, plan.accumulation))


def ranks_that_ran(fact_files: list[str]) -> int:
    """How many ranks the last launch ran, from the ranks' fact files: the world size in the newest one (an
    earlier launch on more nodes leaves its higher ranks' files behind), else (files from before that was
    recorded) how many there are."""
    facts = []
    for path in fact_files:
        with contextlib.suppress(OSError, ValueError), open(path) as f:
            facts.append(json.load(f))
    newest = max((f for f in facts if isinstance(f, dict) and "written" in f and "world_size" in f),
                 key=lambda f: f["written"], default=None)
    return int(newest["world_size"]) if newest is not None else len(fact_files)


def failed_node(nodes: Mapping[str, Mapping[str, Any]], facts_hosts: Mapping[int, Any]) -> dict[str, Any] | None:
    """The node that failed first, as far as the nodes' records tell: an agent killed by a signal (or whose
    driver never recorded its end) before one that merely exited non-zero after a peer was lost."""
    def why(rec: Mapping[str, Any]) -> str | None:
        rc = rec.get("torchrun_exit_code")
        if "ended" not in rec:
            return "its driver recorded no end (the host or the driver was lost)"
        if isinstance(rc, int) and rc < 0:
            return f"its torchrun agent was killed by signal {-rc}"
        if rc:
            return f"its torchrun agent exited with {rc}"
        return None

    ranked = sorted(((0 if "ended" not in r or (r.get("torchrun_exit_code") or 0) < 0 else 1, n, r)
                     for n, r in nodes.items() if why(r)), key=lambda t: (t[0], t[1]))
    if not ranked:
        return None
    _, node, rec = ranked[0]
    return {"node": node, "host": rec.get("host"), "message": f"node {node} (host {rec.get('host')}): {why(rec)}"}


def _tell_lost_nodes(rd: RunDir, manifest: dict[str, Any], nodes: Mapping[str, Mapping[str, Any]],
                     interrupted: int | None) -> None:
    """A node whose driver was lost, recorded in summary.json's ``lost_nodes`` (with the last step each rank
    reached) and, behind a failure, said on the console (a stop's headline says it already), so that a stop or
    failure it caused reads as what it was."""
    from ddp_runner.diagnostics.watchdog import read_progress
    from ddp_runner.launch import node_story

    if interrupted is not None or not node_story.lost_nodes(nodes):
        return
    progress = read_progress(rd.local, int(manifest.get("plan", {}).get("world_size") or 0))
    said = node_story.lines(nodes, str(manifest.get("status")), interrupted, progress)
    summary = rd.read_json(layout.SUMMARY)
    summary["lost_nodes"] = {"nodes": node_story.lost_nodes(nodes), "last_steps": node_story.last_steps(progress)}
    rd.write_json(layout.SUMMARY, summary)
    for line in said:
        print(line, file=sys.stderr, flush=True)


def blame(rd: RunDir, manifest: dict[str, Any], nodes: Mapping[str, Mapping[str, Any]],
          interrupted: int | None = None) -> None:
    """After node 0's finalisation: record every node in run.json and, for a failed run, name the node that failed
    in summary.json's ``failed_node`` and on the console."""
    manifest["nodes"] = dict(nodes)
    rd.write_json(layout.MANIFEST, manifest)
    _tell_lost_nodes(rd, manifest, nodes, interrupted)
    if manifest.get("status") != layout.STATUS_FAILED:
        return
    culprit = failed_node(nodes, {})
    if culprit is None:
        return
    summary = rd.read_json(layout.SUMMARY)
    summary["failed_node"] = culprit
    rd.write_json(layout.SUMMARY, summary)
    print(f"ddp-run: the failure started on {culprit['message']}", file=sys.stderr, flush=True)
