"""No process outlives a run: the supervisor remembers torchrun's descendants while it runs and, once torchrun has
gone, ends any that is left (workers live in their own sessions, so a kill of torchrun's process group misses
them)."""

from __future__ import annotations

import contextlib
import time

import psutil

from ddp_runner.contract.osutil import descendant_pids


def snapshot(pid: int, tree: list[psutil.Process]) -> list[psutil.Process]:
    """``tree`` with the descendants of process ``pid`` that it does not hold yet (each process once)."""
    pids = descendant_pids(pid)
    if pids is None:  # no per-thread children lists: psutil reads every process's status instead
        try:
            pids = [p.pid for p in psutil.Process(pid).children(recursive=True)]
        except psutil.Error:
            return tree
    known = {p.pid for p in tree}
    found = []
    for child in pids:
        if child not in known:
            with contextlib.suppress(psutil.Error):  # ended since
                found.append(psutil.Process(child))
    return tree + found


def reap_tree(tree: list[psutil.Process]) -> None:
    """SIGTERM, then SIGKILL, any worker still alive after torchrun has gone."""
    for p in reap(tree, timeout=5):
        with contextlib.suppress(psutil.Error):
            p.kill()


def _running(p: psutil.Process) -> bool:
    """Alive and not a zombie: a zombie has ended and waits only for its parent to read its status."""
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:  # ended between the two reads
        return False


def reap(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """SIGTERM every process of ``procs`` still running and wait up to ``timeout`` s for them to end; return those
    still running. A process that ends counts as gone at once, even while its zombie waits for its parent:
    ``psutil.wait_procs`` would wait for the zombie of a process re-parented to init (torchrun's agent's
    resource tracker), which some inits reap only seconds later."""
    alive = [p for p in procs if _running(p)]
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.terminate()
    deadline = time.monotonic() + timeout
    delay = 0.01
    while alive and time.monotonic() < deadline:
        time.sleep(delay)
        delay = min(delay * 2, 0.2)
        alive = [p for p in alive if _running(p)]
    return alive
