"""Make every TCPStore server listen only on the address its clients are told to use.

torch's TCPStore server listens on all interfaces (``::``) whatever host name it is given, and it trusts whoever
connects: any host on the network could read and write the rendezvous keys of a running job. torchrun exposes no
option for the listening address, so this module wraps ``TCPStore`` where torchrun (its agent) and the workers
(``init_process_group``'s ``env://``) create one: a server is handed a socket already bound to the address of
its ``host_name`` (``master_listen_fd``). A local run's stores therefore listen on 127.0.0.1; a multi-node run's
on the rendezvous endpoint's interface (the address the other nodes connect to), not on every interface.

Imported by the torchrun agent wrapper (``runner/launch/agent.py``) and by the worker entry (``tasks``); the
driver itself never imports torch through it (``install`` imports torch when called).
"""

from __future__ import annotations

import ipaddress
import os
import socket
import sys
from typing import Any

from ddp_runner.contract import layout

_ARGS = ("host_name", "port", "world_size", "is_master", "timeout", "wait_for_workers", "multi_tenant",
         "master_listen_fd", "use_libuv")


def _is_loopback(addr: str) -> bool:
    try:
        return ipaddress.ip_address(addr.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def listen_address(host: str) -> str | None:
    """The address a store server for clients that connect to ``host`` listens on; None for all interfaces.

    A name that resolves here to a loopback address while it is not itself a loopback name (Debian maps the
    host name to 127.0.1.1) cannot tell us the interface that other hosts reach: then all interfaces (None).
    """
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return None
    addr = str(infos[0][4][0])
    if _is_loopback(addr) and not (host == "localhost" or _is_loopback(host)):
        return None
    return addr


def bound_socket(addr: str, port: int) -> socket.socket:
    """A listening TCP socket on ``addr:port`` (port 0: any free port)."""
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((addr, port))
    sock.listen(1024)
    return sock


def install() -> None:
    """Wrap ``torch.distributed.TCPStore`` in every module that creates a server (idempotent).

    Off when ``layout.ENV_STORE_BIND`` is ``any`` (the user asked for torch's own behaviour).
    """
    if os.environ.get(layout.ENV_STORE_BIND) == "any":
        return
    import torch.distributed as dist

    if getattr(dist.TCPStore, "_ddp_runner_bound", False):
        return
    base = dist.TCPStore

    class BoundTCPStore(base):  # type: ignore[misc, valid-type]
        """A TCPStore whose server listens only on the address of its host name."""

        _ddp_runner_bound = True

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kw = dict(zip(_ARGS, args, strict=False)) | kwargs
            if kw.get("is_master") and kw.get("master_listen_fd") is None:
                addr = listen_address(str(kw.get("host_name", "")))
                if addr is None:
                    print(f"ddp-run: note: {kw.get('host_name')!r} resolves to a loopback address here; its"
                          " TCPStore listens on all interfaces (set the rendezvous endpoint to this host's"
                          " address to bind it)", file=sys.stderr, flush=True)
                else:
                    try:
                        sock = bound_socket(addr, int(kw.get("port") or 0))
                    except OSError as exc:  # as TCPStore says it (callers fall back to a client on RuntimeError)
                        raise RuntimeError(f"cannot listen on {addr}:{kw.get('port')}: {exc}") from exc
                    kw["port"] = sock.getsockname()[1]
                    kw["master_listen_fd"] = sock.detach()  # the store owns the descriptor from here on
            super().__init__(**kw)

    import importlib

    dist.TCPStore = BoundTCPStore  # dynamic_rendezvous and elastic.utils call dist.TCPStore
    # These imported the name at import time (by module name: the attribute torch.distributed.rendezvous is a
    # function of the same name).
    for name in ("torch.distributed.rendezvous", "torch.distributed.elastic.rendezvous.c10d_rendezvous_backend"):
        importlib.import_module(name)
        sys.modules[name].TCPStore = BoundTCPStore
