"""Another node reads run.json while node 0 rewrites it (a multi-node restart under an s3:// root): the reader gets
one whole version, old or new, never an error. s3fs's file object reads by ranges pinned to the ETag it first saw,
and raised FileExpired when the object was replaced in between: the joining node refused with "output.root cannot
be reached from this node" and node 0 waited for it until the test's deadline. The ranks read it too (their sweep
values, the trackers the driver opened), where the same error read as "nothing recorded"."""

from __future__ import annotations

import json
import os
import socket
import time

import fsspec

from ddp_runner.contract import layout
from ddp_runner.launch import multinode
from ddp_runner.rundir import run_dir as rundir
from ddp_runner.tasks.engine.reporting import log_window as tb
from ddp_runner.tasks.engine.trackers import open as trackers_open


def test_a_run_json_replaced_after_the_reader_listed_it_reads_whole(s3_url):  # noqa: F811 - fixture
    url = f"{s3_url}/runs/job_smoke_w2"
    writer = fsspec.filesystem("s3", skip_instance_cache=True)
    path = url.removeprefix("s3://")
    writer.pipe_file(f"{path}/{layout.CONFIG}", b"task: {}\n")
    writer.pipe_file(f"{path}/{layout.MANIFEST}", json.dumps({"status": "completed", "n": 1}).encode())
    rd = rundir.open_run_dir(url)
    rd.fs.ls(path, detail=True)  # the reader's listing, with the first version's ETag, now in its cache
    # Node 0 opens the run for its next attempt: a new run.json (another size and ETag) replaces the old one.
    new = {"status": "running", "n": 2,
           "driver": {"pid": os.getpid(), "host": socket.gethostname(), "heartbeat": time.time()}}
    writer.pipe_file(f"{path}/{layout.MANIFEST}", json.dumps(new).encode())
    assert rd.read_json(layout.MANIFEST)["n"] == 2
    joined = multinode.wait_to_join(url, s3_url, timeout_s=5)
    assert joined.read_json(layout.MANIFEST) == new


def test_the_ranks_read_a_replaced_run_json_whole(s3_url):  # noqa: F811 - fixture
    # A rank reads run.json for its sweep values and the trackers the driver opened: a listing with the old
    # version's ETag in the cache must not turn the new version into "nothing recorded".
    url = f"{s3_url}/runs/job_smoke_w2"
    path = url.removeprefix("s3://")
    writer = fsspec.filesystem("s3", skip_instance_cache=True)
    writer.pipe_file(f"{path}/{layout.MANIFEST}", b"{}")
    reader = fsspec.filesystem("s3")  # the instance fsspec.open and url_to_fs hand out
    reader.ls(path, detail=True)
    new = {"invocation": {"swept": {"train.lr": "0.1"}}, "trackers": {"mlflow": {"run_id": "abc"}}}
    writer.pipe_file(f"{path}/{layout.MANIFEST}", json.dumps(new).encode())
    assert tb.swept_values(url) == {"train.lr": 0.1}
    assert trackers_open.recorded(url) == {"mlflow": {"run_id": "abc"}}
