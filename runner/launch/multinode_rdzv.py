"""launcher=multinode's rendezvous: the endpoint and id checked before anything starts, torchrun's command and
the variables every node's agent gets, and which node this one is (runner/launch/multinode.py runs them).

The rendezvous store listens on the endpoint's address only (``runner/contract/netbind.py``), not on every interface.
"""

from __future__ import annotations

import errno
import os
import socket
from collections.abc import Mapping
from typing import Any

from ddp_runner.config.plan import Plan
from ddp_runner.contract import layout
from ddp_runner.contract.errors import PlanError
from ddp_runner.launch.local import LOOPBACK, agent_prefix, loopback_interface, worker_tail

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
