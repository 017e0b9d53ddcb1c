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

The rendezvous store listens on the endpoint's address only (``runner/contract/netbind.py``), not on every interface.
"""

from __future__ import annotations

import contextlib
import errno
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
from ddp_runner.contract.errors import PlanError
from ddp_runner.contract.rules import flatten, global_batch
from ddp_runner.launch.base import BaseLauncher, Job
from ddp_runner.launch.local import LOOPBACK, agent_prefix, loopback_interface, worker_tail
from ddp_runner.rundir.run_dir import RunDir
from ddp_runner.supervise import finalize

POLL_S = 0.5
# After its own agent ends, how long node 0 waits for the other nodes' drivers to record their end.
NODES_GRACE_S = 30.0
# torchrun's own last call of an elastic range (launcher.last_call_s when a config lacks the key).
LAST_CALL_S = 30


def endpoint_host(launcher: Mapping[str, Any]) -> str:
    """The host part of ``launcher.rdzv_endpoint`` (``host:port``, IPv6 as ``[addr]:port``)."""
    host = str(launcher["rdzv_endpoint"]).rsplit(":", 1)[0]
    return host.strip("[]")


def _is_loopback(host: str) -> bool:
    return host in ("localhost", "::1") or host.startswith("127.")


def check(launcher: Mapping[str, Any]) -> None:
    """Refuse, before anything starts, a multi-node launcher config that torchrun would reject later."""
    for key in ("rdzv_endpoint", "rdzv_id"):
        value = launcher.get(key)
        if value in (None, "", "???"):
            example = "node0.example:29400" if key == "rdzv_endpoint" else "exp42"
            raise PlanError(f"launcher.{key}", value, "is required by launcher=multinode",
                            f"pass the same launcher.{key} on every node, e.g. launcher.{key}={example}")
    endpoint = str(launcher["rdzv_endpoint"])
    host, _, port = endpoint.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise PlanError("launcher.rdzv_endpoint", endpoint, "is not host:port",
                        "use the address of node 0 and a free port, e.g. launcher.rdzv_endpoint=node0.example:29400")
    rdzv_id = str(launcher["rdzv_id"])
    if not rdzv_id.replace("-", "").replace("_", "").replace(".", "").isalnum():
        raise PlanError("launcher.rdzv_id", rdzv_id, "names the run directory: letters, digits, '-', '_', '.' only",
                        "e.g. launcher.rdzv_id=exp42")
    rank, nnodes = launcher.get("node_rank"), launcher.get("nnodes")
    if rank is not None:
        top = int(str(nnodes).split(":")[-1])
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < top:
            raise PlanError("launcher.node_rank", rank, f"must be 0 to {top - 1} (launcher.nnodes={nnodes}), or null",
                            "give node 0 launcher.node_rank=0, the next host 1, and so on")


def check_endpoint_free(host: str, port: int, endpoint: str) -> None:
    """Node 0 hosts the rendezvous store on the endpoint's port: refuse, before anything starts, a port another
    process (another job's store) listens on already, instead of a RendezvousConnectionError after launch."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError:
        return  # an unknown name: torchrun says so itself
    for family, kind, proto, _, addr in infos[:1]:
        with socket.socket(family, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a store closed a moment ago is no clash
            try:
                s.bind(addr)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    raise PlanError("launcher.rdzv_endpoint", endpoint, f"port {port} is already in use on this host"
                                    f" ({_listener(port) or 'another job’s rendezvous, or another server'})",
                                    "pick a free port for this job's launcher.rdzv_endpoint (the same on every node),"
                                    " or wait for the other job to end") from None
                return  # not this host's address (EADDRNOTAVAIL): node 0 runs elsewhere, torchrun decides


def _listener(port: int) -> str | None:
    """Who listens on ``port`` here (``pid 123: python …``), when this process may see it."""
    import psutil

    try:
        pid = next((c.pid for c in psutil.net_connections("tcp") if c.laddr and c.laddr.port == port
                    and c.status == psutil.CONN_LISTEN and c.pid), None)
        if pid is None:
            return None
        return f"pid {pid}: {' '.join(psutil.Process(pid).cmdline())[:160]}"
    except (psutil.Error, OSError):
        return None


# Keys that differ between the nodes of one job by design.
NODE_KEYS = ("launcher.node_rank", "launcher.local_addr", "launcher.join_timeout_s", "dry_run")


def node_differences(mine: Mapping[str, Any], node0: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """``{key: (node 0's value, this node's)}`` for every key of the config as config.yaml records it (secrets
    masked) that differs between this node and node 0, the per-node keys aside."""

    a, b = flatten(node0), flatten(mine)
    return {k: (a.get(k, "<absent>"), b.get(k, "<absent>")) for k in sorted(set(a) | set(b))
            if k not in NODE_KEYS and a.get(k, "<absent>") != b.get(k, "<absent>")}


def check_same_config(rd: RunDir, written: Mapping[str, Any] | None, grace_s: float = 20.0) -> None:
    """A joining node: refuse (PlanError, before its ranks start) a config that differs from node 0's (its
    config.yaml in the shared run directory), naming the keys; every node must run the same plan. A run
    continued with new settings (more steps) still shows the last launch's config.yaml until node 0's copy of
    this launch's lands (an object store, a loaded host): a difference is read again for ``grace_s`` first."""
    if written is None:
        return
    from ddp_runner.rundir import records

    try:  # only a continued run can show the previous launch's config.yaml
        continued = bool(rd.read_json(layout.MANIFEST).get("continued"))
    except (OSError, ValueError):
        continued = False
    deadline = time.monotonic() + (grace_s if continued else 0.0)
    while True:
        try:
            node0 = records.yaml_text_container(records.read_config_text(rd.fs, rd.path))
        except records.DamagedFile as damaged:
            raise damaged.refusal("launcher.rdzv_id") from None
        diff = node_differences(written, node0)
        if not diff or time.monotonic() > deadline:
            break
        time.sleep(POLL_S)
        if hasattr(rd.fs, "invalidate_cache"):
            rd.fs.invalidate_cache()
    if diff:
        shown = "; ".join(f"{k}: node 0 {a!r}, this node {b!r}" for k, (a, b) in list(diff.items())[:6])
        more = f" (and {len(diff) - 6} more)" if len(diff) > 6 else ""
        key, (theirs, mine) = next(iter(diff.items()))
        raise PlanError(key, mine, f"this node's config differs from node 0's ({len(diff)} key"
                        f"{'s' if len(diff) != 1 else ''}: {shown}{more}); every node must run the same plan",
                        "start every node with the same command line (only launcher.node_rank and"
                        " launcher.local_addr may differ)")


def local_addr(launcher: Mapping[str, Any]) -> str | None:
    """This node's address as the others reach it: ``launcher.local_addr``, or 127.0.0.1 for a loopback endpoint
    (all nodes on one host), else None (torchrun uses the host's name)."""
    if launcher.get("local_addr"):
        return str(launcher["local_addr"])
    return LOOPBACK if _is_loopback(endpoint_host(launcher)) else None


def command(plan: Plan, launcher: Mapping[str, Any], run_url: str) -> list[str]:
    """This node's torchrun invocation: c10d rendezvous at ``launcher.rdzv_endpoint``."""
    cmd = [*agent_prefix(), f"--nnodes={launcher.get('nnodes', 1)}", f"--nproc-per-node={plan.nproc_per_node}",
           "--rdzv-backend=c10d", f"--rdzv-endpoint={launcher['rdzv_endpoint']}",
           f"--rdzv-id={launcher['rdzv_id']}", f"--max-restarts={launcher.get('max_restarts', 0)}"]
    rdzv_conf = []
    rank = launcher.get("node_rank")
    if rank is not None:
        # Node 0 hosts the rendezvous store; said explicitly, so that nodes sharing a host never race for it.
        # (--node-rank is not passed: the c10d rendezvous assigns group ranks itself and ignores it.)
        rdzv_conf.append(f"is_host={'true' if rank == 0 else 'false'}")
    if ":" in str(launcher.get("nnodes", "")):
        # An elastic range: once its minimum of nodes has joined, the rendezvous waits this long for more.
        rdzv_conf.append(f"last_call_timeout={launcher.get('last_call_s', LAST_CALL_S)}")
    if rdzv_conf:
        cmd.append(f"--rdzv-conf={','.join(rdzv_conf)}")
    if addr := local_addr(launcher):
        cmd.append(f"--local-addr={addr}")
    return cmd + worker_tail(run_url)


def env(launcher: Mapping[str, Any]) -> dict[str, str]:
    """Variables the agents and workers need (added only where the user has not set them): this node's name, and
    gloo and NCCL on loopback when every node is on this host. On a cluster the user names the interface
    (README)."""
    lo = loopback_interface()
    out = {layout.ENV_NODE: node_name(launcher)}
    if _is_loopback(endpoint_host(launcher)) and lo:
        out.update(GLOO_SOCKET_IFNAME=lo, NCCL_SOCKET_IFNAME=lo)
    return out


def node_name(launcher: Mapping[str, Any]) -> str:
    """This node's name in ``nodes/`` and ``logs/``: its node rank, or ``<host>-<pid>`` for elastic ranks."""
    rank = launcher.get("node_rank")
    return str(rank) if rank is not None else f"{socket.gethostname()}-{os.getpid()}"


def is_creator(launcher: Mapping[str, Any]) -> bool:
    """May this node's driver create (or continue) the run directory? Node 0, or, with elastic ranks, a driver
    on the host the rendezvous endpoint names (where the store is). Several drivers may share that host: the one
    that takes the run directory's lease first creates it, the others join it (``cli._open_multinode_dir``)."""
    rank = launcher.get("node_rank")
    if rank is not None:
        return rank == 0
    host = endpoint_host(launcher)
    try:
        theirs = {a[4][0] for a in socket.getaddrinfo(host, None)}
    except OSError:
        return False
    import psutil

    mine = {a.address.split("%", 1)[0] for addrs in psutil.net_if_addrs().values() for a in addrs}
    return bool(theirs & mine) or host in (socket.gethostname(), socket.getfqdn())


def run_url(conf: Mapping[str, Any], plan: Plan) -> str:
    """The run directory every node computes from the same command line."""
    name = layout.job_run_name(str(conf["launcher"]["rdzv_id"]), conf["task"]["name"], plan.world_size)
    return layout.join(str(conf["output"]["root"]).rstrip("/") or "/", name)


def _unreachable(root: str, exc: BaseException) -> PlanError:
    first = (str(exc).strip().splitlines() or [""])[0][:300]
    return PlanError("output.root", root, f"cannot be reached from this node ({type(exc).__name__}: {first})",
                     "give every node the same output.root on a filesystem they all mount, or an s3:// URL")


def exists(url: str) -> bool:
    """Is ``url`` a run directory already (config and manifest written)?"""
    import fsspec

    fs, path = fsspec.core.url_to_fs(url)
    fs.invalidate_cache()
    return fs.exists(layout.join(path, layout.CONFIG)) and fs.exists(layout.join(path, layout.MANIFEST))


def create(url: str, rdzv_id: str) -> RunDir:
    """Node 0: make the run directory and its subfolders, holding its lease (rundir/lease.py) as a local run's
    driver does, so that a second node-0 driver of the same job is refused (exit 2) however close behind it
    starts. PlanError when the root cannot be written, :class:`Held` when another live driver holds the run
    directory; a directory this driver made is removed again then, one another driver made is left to it."""
    import fsspec
    from fsspec.implementations.local import LocalFileSystem

    from ddp_runner.rundir import run_dir as rundir
    from ddp_runner.rundir.lease import Taken, take

    try:
        fs, path = fsspec.core.url_to_fs(url)
        path = path.rstrip("/")
        local = isinstance(fs, LocalFileSystem)
        made = not fs.exists(path)
        if local:  # the flock lives in the directory: make it first (there the flock is the claim, not mkdir)
            fs.makedirs(path, exist_ok=True)
        lease = take(fs, path)  # an object store has no directories: its conditional put is the claim
    except Taken as held:
        raise _held(url, rdzv_id, held.holder) from None
    except Exception as exc:  # a backend's own error types too: a refusal, not a traceback
        raise _unreachable(str(url).rsplit("/", 1)[0], exc) from exc
    try:
        for sub in (layout.LOGS, layout.TB, layout.CHECKPOINTS, layout.NODES):
            fs.makedirs(layout.join(path, sub), exist_ok=True)
    except Exception as exc:
        lease.release()
        if made and local:
            fs.rm(path, recursive=True)
        raise _unreachable(str(url).rsplit("/", 1)[0], exc) from exc
    rd = rundir.open_run_dir(url)
    rd.lease = lease  # held until node 0's driver exits; renewed on its tick (object stores)
    if rd.is_remote:
        rd.local = rundir.staging_dir(rd.path)
    return rd


class Held(PlanError):
    """Another live driver holds the run directory's lease: a refusal for node 0; with elastic ranks
    (``launcher.node_rank=null``) the sign that another node's driver opened the directory first."""


def take_lease(rd: RunDir, rdzv_id: str) -> None:
    """Node 0 continuing its run directory (a restart): take its lease; :class:`Held` while another live driver
    holds it."""
    from ddp_runner.rundir.lease import Taken, take

    try:
        rd.lease = take(rd.fs, rd.path)
    except Taken as held:
        raise _held(rd.url, rdzv_id, held.holder) from None


def _held(url: str, rdzv_id: str, holder: dict[str, Any] | None) -> Held:
    from ddp_runner.rundir import status

    d = holder or {}
    who = status.describe_driver({"driver": d})
    return Held("launcher.rdzv_id", rdzv_id,
                     f"its run directory {url} is held by another live driver ({who}); one node-0 driver per run"
                     " directory",
                     f"wait for that job to end, or stop it (Ctrl-C, or kill -INT {d.get('pid')} on"
                     f" {d.get('host')}), or start this job under another launcher.rdzv_id")


def wait_to_join(url: str, root: str, timeout_s: float) -> RunDir:
    """Another node: wait until node 0's driver has opened the run directory for this attempt (run.json says
    running, with a live driver), then return it. Refuses with the reason when it cannot."""
    from ddp_runner.rundir import run_dir as rundir
    from ddp_runner.rundir import status

    deadline = time.monotonic() + timeout_s
    said = False
    while True:
        try:
            if exists(url):
                rd = rundir.open_run_dir(url)
                if status.status_of(rd.read_json(layout.MANIFEST)) == layout.STATUS_RUNNING:
                    if rd.is_remote:
                        rd.local = rundir.staging_dir(rd.path)
                    return rd
        except (OSError, ValueError) as exc:
            raise _unreachable(root, exc) from exc
        if time.monotonic() > deadline:
            raise PlanError("output.root", root,
                            f"node 0 did not open {url} within {timeout_s:.0f} s",
                            "start node 0 (launcher.node_rank=0) with the same command line and output.root on a"
                            " filesystem every node mounts; or raise launcher.join_timeout_s")
        if not said:
            print(f"ddp-run: waiting for node 0 to open {url}", flush=True)
            said = True
        time.sleep(POLL_S)


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


def blame(rd: RunDir, manifest: dict[str, Any], nodes: Mapping[str, Mapping[str, Any]]) -> None:
    """After node 0's finalisation: record every node in run.json and, for a failed run, name the node that failed
    in summary.json's ``failed_node`` and on the console."""
    manifest["nodes"] = dict(nodes)
    rd.write_json(layout.MANIFEST, manifest)
    if manifest.get("status") != layout.STATUS_FAILED:
        return
    culprit = failed_node(nodes, {})
    if culprit is None:
        return
    summary = rd.read_json(layout.SUMMARY)
    summary["failed_node"] = culprit
    rd.write_json(layout.SUMMARY, summary)
    print(f"ddp-run: the failure started on {culprit['message']}", file=sys.stderr, flush=True)


def open_node0(conf: Mapping[str, Any], plan: Plan) -> RunDir | None:
    """Node 0 of a multi-node run: create its run directory, or continue it when it already holds the run (a
    restart of the same command: ``continued`` set), holding its lease. None on the other nodes, and, with
    elastic ranks (``launcher.node_rank=null``, several drivers on the endpoint's host), on every driver
    but the one that took the lease first: exactly one driver opens the run directory."""
    from ddp_runner.rundir import run_dir as rundir
    from ddp_runner.rundir import status
    from ddp_runner.rundir.resume import check_no_live_driver

    launcher = conf["launcher"]
    if not is_creator(launcher):
        return None
    elastic = launcher.get("node_rank") is None
    url = run_url(conf, plan)
    rdzv_id = str(launcher["rdzv_id"])
    try:
        again = exists(url)
    except (OSError, ValueError) as exc:
        raise PlanError("output.root", conf["output"]["root"], f"cannot be reached ({type(exc).__name__}: {exc})",
                        "give every node the same output.root on a filesystem they all mount") from exc
    try:
        if not again:
            return create(url, rdzv_id)
        rd = rundir.open_run_dir(url)
        previous = rd.read_json(layout.MANIFEST)
        if elastic and status.status_of(previous) == layout.STATUS_RUNNING:
            raise Held("launcher.rdzv_id", rdzv_id, "opened by another driver", "")
        check_no_live_driver(rd.url, previous)
        take_lease(rd, rdzv_id)  # held until this driver exits, as a local run's driver holds its own
    except Held:
        if not elastic:
            raise
        # Another driver of this job (launcher.node_rank=null) opened it first: this one joins as another node.
        print(f"ddp-run: another driver of this job opened {url} first: joining it", flush=True)
        return None
    print(f"ddp-run: {url} holds this run already: continuing it (resume from its newest checkpoint)", flush=True)
    rd.continued = True
    return rd


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
                                preempt=session.preempt)
        blame(rd, manifest, nodes)
        session.close()
        print(rd.url, flush=True)
        return code


LAUNCHER = Multinode()
