"""The driver's record of torchrun's descendants (runner/supervise/reaper.py: ``snapshot``), read from Linux's
per-thread children lists (runner/contract/osutil.py: ``descendant_pids``), and psutil's scan where the kernel has
none: the same processes either way, on a real tree of three generations."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import psutil
import pytest

from ddp_runner.contract import osutil
from ddp_runner.supervise import reaper

# A child that starts a grandchild from a thread that stays alive (the list is that thread's, not the main
# thread's: every thread's list must be read), then waits.
TREE = """
import subprocess, sys, threading, time
def start():
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    print("up", flush=True)
    time.sleep(60)
threading.Thread(target=start, daemon=True).start()
time.sleep(60)
"""


@pytest.fixture
def tree() -> Iterator[subprocess.Popen[str]]:
    root = subprocess.Popen([sys.executable, "-c", TREE], stdout=subprocess.PIPE, text=True)
    try:
        assert root.stdout is not None and root.stdout.readline().strip() == "up"
        yield root
    finally:
        for p in psutil.Process(root.pid).children(recursive=True):
            p.kill()
        root.kill()
        root.wait()


@pytest.mark.skipif(not osutil._children_lists(), reason="this kernel keeps no per-thread children lists")
def test_the_walk_finds_what_psutils_scan_finds(tree: subprocess.Popen[str]) -> None:
    expected = {p.pid for p in psutil.Process(tree.pid).children(recursive=True)}
    assert len(expected) == 1
    assert set(osutil.descendant_pids(tree.pid) or []) == expected
    me = set(osutil.descendant_pids(psutil.Process().pid) or [])
    assert {tree.pid} | expected <= me, "a grandchild is found through its parent"


def test_a_gone_process_has_no_descendants_and_no_lists_means_psutil(monkeypatch: pytest.MonkeyPatch) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert osutil.descendant_pids(gone.pid) in ([], None)
    monkeypatch.setattr(osutil, "_children_lists", lambda: False)
    assert osutil.descendant_pids(psutil.Process().pid) is None


@pytest.mark.parametrize("lists", [True, False])
def test_the_supervisor_remembers_every_descendant_once(tree: subprocess.Popen[str], lists: bool,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    if not lists:
        monkeypatch.setattr(reaper, "descendant_pids", lambda pid: None)
    elif not osutil._children_lists():
        pytest.skip("this kernel keeps no per-thread children lists")
    expected = {p.pid for p in psutil.Process(tree.pid).children(recursive=True)}
    first = reaper.snapshot(tree.pid, [])
    assert {p.pid for p in first} == expected
    again = reaper.snapshot(tree.pid, first)
    assert [p.pid for p in again] == [p.pid for p in first], "nothing twice"


# A parent that starts a child and never reads its status: the child, once ended, stays a zombie.
NEGLECTFUL_PARENT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
print(child.pid, flush=True)
time.sleep(60)
"""


def test_the_reaper_counts_an_ended_process_as_gone_while_its_zombie_waits_for_its_parent() -> None:
    """The driver's reaper must not wait for a parent it does not control (init reaps a re-parented process's
    zombie when it will): a worker it ended is gone, zombie or not."""
    parent = subprocess.Popen([sys.executable, "-c", NEGLECTFUL_PARENT], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        child = psutil.Process(int(parent.stdout.readline()))
        still = reaper.reap([child], timeout=30)
        assert still == []
        assert child.status() == psutil.STATUS_ZOMBIE, "its parent has not read its status: only it can"
        assert reaper.reap([child], timeout=30) == [], "a zombie is not signalled or waited for again"
    finally:
        parent.kill()
        parent.wait()
