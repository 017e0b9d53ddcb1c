"""launcher=multinode's shared run directory: its URL (the same on every node), node 0 creating or continuing
it under its lease, and every other node waiting for it and checking that it runs the same config.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from ddp_runner.config.plan import Plan
from ddp_runner.contract import layout
from ddp_runner.contract.errors import PlanError
from ddp_runner.contract.rules import flatten
from ddp_runner.launch.multinode_rdzv import is_creator
from ddp_runner.rundir.run_dir import RunDir

POLL_S = 0.5  # how often a node reads the shared run directory again


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
