"""One writer per run directory (runner/rundir/lease.py): on a local disk through ``flock``, on S3 (the real moto server
of tests/s3_server.py, on loopback) through conditional puts. Racing takers are real processes."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import fsspec

from ddp_runner.contract import layout
from ddp_runner.rundir import lease
from tests.support.driver import ddp_run
from tests.support.lease_taker import TAKER

ROOT = Path(__file__).resolve().parents[2]

def test_a_second_driver_is_refused_naming_the_live_one(out_root, smoke_reference):
    run = smoke_reference  # a completed run (made once per session; the refusal must leave it as it is)
    manifest_before = (run / layout.MANIFEST).read_bytes()
    held = lease.take(fsspec.filesystem("file"), str(run))  # this process plays the live driver
    try:  # trained longer (a completed run continues only so), but another driver holds it
        r = ddp_run([f"resume={run}", "train.max_steps=16"], out_root)
    finally:
        held.release()
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"pid {os.getpid()} on host {socket.gethostname()}" in r.stderr and "one driver per run" in r.stderr
    assert json.loads((run / layout.MANIFEST).read_text())["status"] == "completed", "the refusal wrote nothing"
    assert (run / layout.MANIFEST).read_bytes() == manifest_before


def test_s3_resume_refused_while_a_live_driver_holds_it_and_free_after_it_dies(s3_url, tmp_path):  # noqa: F811
    r = ddp_run(["device=cpu", "task=smoke", "world_size=1", "train.max_steps=2"], s3_url)
    assert r.returncode == 0, r.stderr
    fs = fsspec.filesystem("s3")
    fs.invalidate_cache()
    [cfg] = fs.glob(s3_url.removeprefix("s3://") + "/*/*/config.yaml")
    run = cfg.rsplit("/", 1)[0]
    holder = subprocess.Popen([sys.executable, "-c", TAKER, f"s3://{run}", str(tmp_path / "go"), "60"], cwd=ROOT,
                              stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    (tmp_path / "go").touch()
    assert holder.stdout.readline().strip() == "ready"
    assert holder.stdout.readline().strip() == "won"
    r = ddp_run([f"resume=s3://{run}", "train.max_steps=4"], tmp_path / "unused")  # trained longer
    assert r.returncode == 2 and f"pid {holder.pid} on host" in r.stderr, r.stderr
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    r = ddp_run([f"resume=s3://{run}", "train.max_steps=4"], tmp_path / "unused")
    assert r.returncode == 0, r.stderr
    fs.invalidate_cache()
    assert not fs.exists(f"{run}/{layout.DRIVER_LEASE}"), "released at the end of the run"
