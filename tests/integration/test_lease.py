"""One writer per run directory (runner/rundir/lease.py): on a local disk through ``flock``, on S3 (the real moto server
of tests/s3_server.py, on loopback) through conditional puts. Racing takers are real processes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import fsspec
import pytest

from ddp_runner.contract import layout
from ddp_runner.rundir import lease
from ddp_runner.rundir import run_dir as rundir
from tests.support.lease_taker import TAKER

ROOT = Path(__file__).resolve().parents[2]

def _takers(url: str, tmp: Path, n: int = 2, hold_s: float = 3.0) -> list[str]:
    """Start ``n`` processes that take the lease on ``url`` at the same moment; their answers."""
    go = tmp / f"go{time.monotonic_ns()}"
    procs = [subprocess.Popen([sys.executable, "-c", TAKER, url, str(go), str(hold_s)], cwd=ROOT,
                              stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
             for _ in range(n)]
    for p in procs:  # every one imported and polling
        assert p.stdout.readline().strip() == "ready"
    go.touch()
    answers = [p.stdout.readline().strip() for p in procs]
    for p in procs:
        p.kill()
        p.wait()
    return answers


def test_local_lease_one_holder_and_a_dead_one_never_blocks(tmp_path):
    fs = fsspec.filesystem("file")
    answers = _takers(str(tmp_path), tmp_path, n=3)
    assert sorted(a.split()[0] for a in answers) == ["taken", "taken", "won"], answers
    # The winner was SIGKILLed (no chance to release anything): the kernel dropped its flock.
    mine = lease.take(fs, str(tmp_path))
    with pytest.raises(lease.Taken) as t:  # ... and a second holder in this very process is refused too
        lease.take(fs, str(tmp_path))
    assert t.value.holder["pid"] == os.getpid() and t.value.holder["host"] == socket.gethostname()
    mine.release()
    lease.take(fs, str(tmp_path)).release()


def test_s3_lease_races_stale_leases_and_a_lost_lease(s3_url, tmp_path):  # noqa: F811 - fixture
    fs = fsspec.filesystem("s3")
    run = s3_url.removeprefix("s3://") + "/run"
    for _ in range(3):  # exactly one of two racing takers wins the conditional put, every time
        fs.invalidate_cache()
        for p in fs.glob(run + "/*"):
            fs.rm_file(p)
        answers = _takers(f"s3://{run}", tmp_path, n=2, hold_s=0)
        assert sorted(a.split()[0] for a in answers) == ["taken", "won"], answers
    # The winner's process is gone and it ran on this host: its lease is taken over at once.
    mine = lease.take(fs, run)
    with pytest.raises(lease.Taken):
        lease.take(fs, run)
    # Another host's lease: fresh blocks, a heartbeat older than STALE_AFTER_S does not.
    key = f"{run}/{layout.DRIVER_LEASE}"
    other = {"host": "elsewhere", "pid": 1, "started": 0.0, "token": "t", "heartbeat": time.time()}
    fs.pipe_file(key, json.dumps(other).encode())
    with pytest.raises(lease.Taken) as t:
        lease.take(fs, run)
    assert t.value.holder["host"] == "elsewhere"
    fs.pipe_file(key, json.dumps({**other, "heartbeat": time.time() - 3600}).encode())
    taken_over = lease.take(fs, run)
    # The old holder comes back (it only looked dead): its renewal fails and it knows it lost the directory.
    mine.last = -1e9
    mine.refresh()
    assert mine.lost
    mine.release()  # not ours any more: left alone
    assert json.loads(fs.cat_file(key))["token"] == taken_over.record["token"]
    taken_over.last = -1e9
    taken_over.refresh()
    assert not taken_over.lost
    taken_over.release()
    fs.invalidate_cache()
    assert not fs.exists(key)


def test_s3_run_directories_claimed_in_the_same_second_are_distinct(s3_url):  # noqa: F811 - fixture
    now = datetime(2026, 1, 2, 3, 4, 5)
    a = rundir.create_run_dir(s3_url, "smoke", 2, now)
    b = rundir.create_run_dir(s3_url, "smoke", 2, now)
    assert a.path != b.path and b.path.endswith("_1")
    for rd in (a, b):
        rd.lease.release()
