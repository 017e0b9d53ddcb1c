"""launcher=multinode on one machine: two node agents (2 nodes × 1 rank, gloo) joined by a c10d rendezvous on
loopback, each started by its own ``ddp-run`` with the same command line; and where a job's stores listen."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import fsspec
import psutil
import pytest

from ddp_runner.contract import layout
from ddp_runner.rundir.lease import Taken, take
from tests.support.ports import free_port
from tests.support.recipes import rank0_sleeps
from tests.support.run_tree import load_json, run_dirs
from tests.support.waiting import wait_for

GPT = ["task=gpt", "train.max_steps=4", "data.val_fraction=0.01", "checkpoint.async_save=false"]


# Rank 0 sleeps 0.2 s after every step from step 1 on (rank 1 waits for it in the next all-reduce): a job that a
# test looks at while it runs (train.max_steps=1000000) stays up without both ranks training flat out meanwhile.
IDLE = rank0_sleeps(0.2)


def node_args(rank: int | None, port: int, rdzv_id: str, *args: str) -> list[str]:
    """One node's ``ddp-run`` arguments but output.root, as the README has them (only the node rank differs
    between the nodes)."""
    return ["device=cpu", "world_size=2", "launcher=multinode", "launcher.nnodes=2",
            f"launcher.node_rank={'null' if rank is None else rank}", f"launcher.rdzv_endpoint=127.0.0.1:{port}",
            f"launcher.rdzv_id={rdzv_id}", "timeout_s=60", *args]


def start_node(rank: int | None, root: Path | str, port: int, rdzv_id: str, *args: str,
               env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """One node's ``ddp-run``, as the README has it (only the node rank differs between the nodes)."""
    cmd = [sys.executable, "-m", "ddp_runner", *node_args(rank, port, rdzv_id, *args), f"output.root={root}"]
    return subprocess.Popen(cmd, cwd=tempfile.gettempdir(), env={**os.environ, **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(*procs: subprocess.Popen[str], timeout: float = 240) -> list[tuple[int, str, str]]:
    """Wait for every driver; on a timeout stop them all (Ctrl-C, then SIGKILL) so that a failing test leaves
    no process behind, and fail with every driver's output (the one that ended first is often the one that
    says why)."""
    try:
        outputs = [p.communicate(timeout=timeout) for p in procs]
    except subprocess.TimeoutExpired:
        running = [p.poll() is None for p in procs]
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
        said = []
        for i, p in enumerate(procs):
            try:
                out, err = p.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
                out, err = p.communicate()
            state = "still running, stopped" if running[i] else f"ended by itself, rc {p.returncode}"
            said.append(f"--- driver {i} ({state}):\n{out[-3000:]}\n{err[-6000:]}")
        pytest.fail(f"the drivers did not all end within {timeout:.0f} s:\n" + "\n".join(said))
    return [(p.returncode, *o) for p, o in zip(procs, outputs, strict=True)]


def test_two_nodes_complete_with_a_checkpoint_and_record_every_node(out_root):
    # The GPT task (data, validation, a checkpoint); the smoke task completes on two nodes below (s3 root, elastic).
    task = GPT
    port = free_port()
    nodes = [start_node(r, out_root, port, "exp1", *task) for r in (0, 1)]
    results = finish(*nodes)
    for rc, out, err in results:
        assert rc == 0, out + err
    [run] = run_dirs(out_root)
    assert run.parent == out_root and run.name == f"exp1_{task[0].split('=')[1]}_w2", "named from rdzv_id"
    assert results[0][1].strip().splitlines()[-1] == results[1][1].strip().splitlines()[-1] == str(run)

    manifest, summary = load_json(run / "run.json"), load_json(run / "summary.json")
    assert manifest["status"] == summary["status"] == "completed"
    assert summary["completion"]["all_completed"] and summary["completion"]["distinct_devices"]
    assert sorted(manifest["nodes"]) == ["0", "1"]
    for n in ("0", "1"):
        node = manifest["nodes"][n]
        assert node["host"] == socket.gethostname() and node["devices"] == [{"local_rank": 0, "name": "cpu"}]
        assert node["status"] == "completed" and node["torchrun_exit_code"] == 0
    assert {r["node"] for r in manifest["ranks"].values()} == {"0", "1"}
    for rank in (0, 1):
        log = (run / layout.rank_log(rank)).read_text()
        assert f"ddp-run: rank {rank} on node " in log and f"rank {rank} device node" in log
    assert [p.name for p in (run / "checkpoints").iterdir()], "rank 0 wrote the final checkpoint"
    # Only one run directory for the job, and both agents' logs in it.
    assert (run / layout.node_agent_log(0)).is_file() and (run / layout.node_agent_log(1)).is_file()


def test_killing_one_node_fails_the_run_naming_it_and_a_restart_resumes(out_root):
    port = free_port()
    args = ["task=smoke", "train.max_steps=6", "checkpoint.every_steps=2", "checkpoint.async_save=false"]
    # Rank 1 (node 1) hangs after step 3: step_2 is committed, and the job waits on node 1.
    hang = ["fault.kind=hang", "fault.rank=1", "fault.step=3"]
    nodes = [start_node(r, out_root, port, "exp2", *args, *hang) for r in (0, 1)]
    deadline = time.monotonic() + 120
    agent = None
    while time.monotonic() < deadline and agent is None:
        ckpts = list(out_root.rglob("step_2/meta.json"))
        kids = psutil.Process(nodes[1].pid).children()
        agent = kids[0] if ckpts and kids else None
        time.sleep(0.3)
    assert agent is not None, "node 1's agent never ran to a checkpoint"
    agent.send_signal(signal.SIGKILL)  # node 1's torchrun agent is lost (its worker goes with it)
    (rc0, out0, err0), (rc1, _, err1) = finish(*nodes)
    assert rc0 != 0 and rc1 != 0, out0 + err0
    [run] = run_dirs(out_root)
    summary = load_json(run / "summary.json")
    assert summary["status"] == "failed"
    assert summary["failed_node"]["node"] == "1", summary
    assert "node 1" in err0 and "killed by signal 9" in err0, err0
    assert load_json(run / "nodes" / "1.json")["torchrun_exit_code"] == -9

    # The same two commands again: the run directory is continued and the run resumes from its checkpoint.
    (rc0, out0, err0), (rc1, out1, err1) = finish(*[start_node(r, out_root, port, "exp2", *args)
                                                   for r in (0, 1)])
    assert rc0 == 0 and rc1 == 0, out0 + err0 + out1 + err1
    assert run_dirs(out_root) == [run]
    summary = load_json(run / "summary.json")
    assert summary["status"] == "completed" and summary["steps"] == 6
    assert "resumed from" in (run / layout.rank_log(0)).read_text()
    assert len(load_json(run / "run.json")["continued"]) == 1


def test_a_rank_killed_on_node_1_is_named_with_its_exit_code(out_root):
    # Rank 1 dies of SIGKILL on node 1: no error record of its own, only node 1's torchrun log has its exit code.
    port = free_port()
    args = ["task=smoke", "train.max_steps=6", "fault.kind=sigkill", "fault.rank=1", "fault.step=2"]
    (rc0, out0, err0), (rc1, _, _) = finish(*[start_node(r, out_root, port, "exp5", *args) for r in (0, 1)])
    assert rc0 != 0 and rc1 != 0, out0 + err0
    [run] = run_dirs(out_root)
    manifest, summary = load_json(run / "run.json"), load_json(run / "summary.json")
    assert manifest["exit_codes"]["1"] == -9, manifest["exit_codes"]
    assert summary["root_cause"]["rank"] == 1 and summary["root_cause"]["class"] == "signal", summary["root_cause"]


def test_multinode_refuses_missing_endpoint_and_a_node_that_cannot_join(out_root, cli):
    # In process: main() refuses before anything starts (the lonely node after waiting for node 0 in vain).
    r = cli(["device=cpu", "world_size=2", "launcher=multinode", "launcher.rdzv_id=x"], out_root)
    assert r.returncode == 2 and "launcher.rdzv_endpoint" in r.stderr, r.stderr
    r = cli(["device=cpu", "world_size=3", "launcher=multinode", "launcher.rdzv_id=x",
             "launcher.rdzv_endpoint=127.0.0.1:1234"], out_root)
    assert r.returncode == 2 and "world_size=3" in r.stderr and "launcher.nnodes=2" in r.stderr, r.stderr
    # Node 1 alone: node 0 never opens the run directory, so it refuses with the reason, leaving nothing.
    r = cli(node_args(1, free_port(), "lonely", "launcher.join_timeout_s=2"), out_root)
    assert r.returncode == 2 and "node 0 did not open" in r.stderr and "output.root" in r.stderr, r.stderr
    assert not out_root.exists() or run_dirs(out_root) == []


def _listening(pids: list[int]) -> set[str]:
    found = set()
    for pid in pids:
        try:
            for c in psutil.Process(pid).net_connections("inet"):
                if c.status == psutil.CONN_LISTEN:
                    found.add(c.laddr.ip)
        except psutil.Error:
            continue
    return found


@pytest.mark.parametrize("restarts", [0, 1])
def test_a_local_job_listens_on_loopback_only(out_root, restarts):
    # restarts=0: the workers use the agent's store; 1: rank 0 hosts its own (TORCH_DISABLE_SHARE_RDZV_TCP_STORE).
    driver = subprocess.Popen([sys.executable, "-m", "ddp_runner", "device=cpu", "world_size=2",
                               "train.max_steps=1000000", "train.log_every=1000", *IDLE,
                               f"launcher.max_restarts={restarts}", f"output.root={out_root}"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tempfile.gettempdir())
    try:
        # A rank writes its facts once its process group is up: by then the agent's store, rank 0's own and the
        # ranks' gloo sockets all listen. (Not progress/rank*.json: rank 0's could come before rank 1's facts.)
        wait_for("both ranks' facts", lambda: len(list(out_root.rglob("logs/rank*.json"))) == 2, driver=driver)
        tree = [driver.pid, *(p.pid for p in psutil.Process(driver.pid).children(recursive=True))]
        assert len(tree) >= 4, "driver, agent and two workers"
        addresses = _listening(tree)
    finally:
        driver.send_signal(signal.SIGINT)
        driver.communicate(timeout=60)
    assert addresses, "the agent's store listens somewhere"
    assert addresses <= {"127.0.0.1", "::1"}, f"listening beyond loopback: {addresses}"


def test_an_elastic_range_runs_with_the_nodes_present(out_root):
    # launcher.nnodes=1:2 with one node: torchrun waits for its last call (launcher.last_call_s, torchrun's 30 s
    # when unset), then runs on that node alone; the run is judged by the ranks that ran, not the plan's maximum.
    rc, out, err = finish(start_node(0, out_root, free_port(), "el", "task=smoke", "train.max_steps=2",
                                     "launcher.nnodes=1:2", "launcher.last_call_s=2"))[0]
    assert rc == 0, out + err
    assert "elastic: the job ran 1 of at most 2 ranks (1 of 2 nodes)" in out
    [run] = run_dirs(out_root)
    summary = load_json(run / "summary.json")
    assert summary["status"] == "completed" and summary["completion"]["completed_ranks"] == [0]
    command = load_json(run / "run.json")["command"]
    assert "--nnodes=1:2" in command
    assert "--rdzv-conf=is_host=true,last_call_timeout=2" in command, command


def test_two_nodes_under_an_s3_root_are_judged_from_every_nodes_ranks_and_a_restart_keeps_their_logs(
        s3_url):  # noqa: F811 - fixture
    # No shared filesystem: each node stages its ranks' files on its own disk (two staging folders here) and
    # mirrors them to the bucket. Node 0 must judge the run from both nodes' ranks, not only its own.
    root, port = f"{s3_url}/runs", free_port()
    args = ["task=smoke", "checkpoint.async_save=false"]
    nodes = [start_node(r, root, port, "s3job", *args, "train.max_steps=4") for r in (0, 1)]
    fs = fsspec.filesystem("s3")
    run = f"{root}/s3job_smoke_w2".removeprefix("s3://")
    lease = f"{run}/{layout.DRIVER_LEASE}"
    joined = f"{run}/{layout.node_record(1)}"
    while nodes[0].poll() is None and not fs.exists(joined):
        time.sleep(0.1)
        fs.invalidate_cache()
    # Node 1 has joined, and its workers need seconds to start: node 0's driver holds the lease now.
    holder = json.loads(fs.cat_file(lease)) if fs.exists(lease) else None
    results = finish(*nodes)
    for rc, out, err in results:
        assert rc == 0, out + err
    assert holder is not None and holder["pid"] == nodes[0].pid, holder
    fs.invalidate_cache()
    assert not fs.exists(lease), "released when node 0's driver ended"

    manifest = json.loads(fs.cat_file(f"{run}/run.json"))
    summary = json.loads(fs.cat_file(f"{run}/summary.json"))
    assert manifest["status"] == summary["status"] == "completed", summary
    assert summary["completion"]["completed_ranks"] == [0, 1] and summary["steps"] == 4, summary
    assert summary["root_cause"] is None
    assert sorted(manifest["nodes"]) == ["0", "1"]
    assert {n["host"] for n in manifest["nodes"].values()} == {socket.gethostname()}
    assert {r["node"] for r in manifest["ranks"].values()} == {"0", "1"}, manifest["ranks"]
    for rank in (0, 1):
        assert fs.exists(f"{run}/logs/rank{rank}.json")
    assert not fs.exists(f"{run}/{layout.STACKS}"), fs.find(f"{run}/{layout.STACKS}")  # no hang: no stack files

    # The same two commands with more steps continue the run. Each rank's log goes on across restarts: under s3://
    # every node stages the earlier lines before its ranks append, and mirrors only what changed (no node pushes
    # its stale copy of a log another node's rank writes).
    results = finish(*[start_node(r, root, port, "s3job", *args, "train.max_steps=6") for r in (0, 1)])
    for rc, out, err in results:
        assert rc == 0, out + err
    fs.invalidate_cache()
    summary = json.loads(fs.cat_file(f"{run}/summary.json"))
    assert summary["status"] == "completed" and summary["steps"] == 6, summary
    for rank in (0, 1):
        log = fs.cat_file(f"{run}/logs/rank{rank}.log").decode()
        assert log.count(f"ddp-run: rank {rank} on node ") == 2, log
        assert "resumed from" in log, log


def test_a_hang_on_node_1_under_an_s3_root_is_named_there_with_its_stack(s3_url):  # noqa: F811 - fixture
    # Node 1's ranks write their progress and stacks on node 1's disk. Node 0's watchdog must read them from the
    # bucket: before, it saw only rank 0, waiting in a collective for the stuck rank 1, and named rank 0.
    # checkpoint.stop_grace_s=2: the ranks the watchdog stops cannot reach a step boundary (one is stuck, the
    # other waits for it), so each node's rank would wait half the default grace (10 s) for nothing.
    root, port = f"{s3_url}/runs", free_port()
    nodes = [start_node(r, root, port, "hangjob", "task=smoke", "train.max_steps=200", "fault.kind=hang",
                        "fault.rank=1", "fault.step=3", "watchdog.timeout_s=10", "timeout_s=90",
                        "checkpoint.stop_grace_s=2") for r in (0, 1)]
    (rc0, out0, err0), (rc1, out1, err1) = finish(*nodes)
    assert rc0 == 1 and rc1 != 0, out0 + err0 + out1 + err1
    assert "HANG: rank 1 made no progress" in err0 and "faults.py" in err0, err0
    fs = fsspec.filesystem("s3")
    fs.invalidate_cache()
    run = f"{root}/hangjob_smoke_w2".removeprefix("s3://")
    hang = json.loads(fs.cat_file(f"{run}/{layout.HANG_RECORD}"))
    assert hang["rank"] == 1 and hang["step"] == 3, hang
    assert "faults.py" in hang["top_frame"] and "_inject" in hang["top_frame"], hang
    assert hang["no_progress_s"] >= 10, hang  # the copy's lag is not counted as progress
    assert sorted(hang["ranks"]) == ["0", "1"] and "distributed" in hang["ranks"]["0"]["top_frame"], hang
    stack = fs.cat_file(f"{run}/{layout.rank_stack(1)}").decode()
    assert "in _inject" in stack, stack
    summary = json.loads(fs.cat_file(f"{run}/summary.json"))
    assert summary["root_cause"]["rank"] == 1 and summary["root_cause"]["class"] == "hang", summary["root_cause"]


def test_node_0_holds_the_lease_and_a_second_node_0_is_refused(out_root, cli):
    port = free_port()
    args = ["task=smoke", "train.max_steps=1000000", "train.log_every=1000", *IDLE]
    nodes = [start_node(r, out_root, port, "held", *args) for r in (0, 1)]
    try:
        run = out_root / "held_smoke_w2"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and len(list(run.glob("logs/rank*.json"))) < 2:
            assert all(p.poll() is None for p in nodes), finish(*nodes)
            time.sleep(0.2)
        # The run directory's lease is node 0's driver's: nobody else can take it while that driver lives.
        with pytest.raises(Taken) as held:
            take(fsspec.filesystem("file"), str(run)).release()
        assert held.value.holder["pid"] == nodes[0].pid
        # The same node-0 command a second time (main() in this process: refused before it launches anything):
        # refused (exit 2), the running job left alone.
        r = cli(node_args(0, port, "held", *args), out_root)
        assert r.returncode == 2 and "refused" in r.stderr and str(nodes[0].pid) in r.stderr, r.stderr
        assert all(p.poll() is None for p in nodes), "the first job still runs"
    finally:
        for p in nodes:
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
        finish(*nodes, timeout=120)
    assert run_dirs(out_root) == [run]
    assert load_json(run / "run.json")["status"] == "interrupted"


def test_elastic_ranks_with_both_agents_on_one_host_open_one_run_directory(out_root):
    # launcher.node_rank=null: torchrun assigns the ranks, and both drivers run on the endpoint's host, so both
    # may open the run directory. The one that takes its lease first does; the other joins it as a node.
    port = free_port()
    nodes = [start_node(None, out_root, port, "el2", "task=smoke", "train.max_steps=4") for _ in range(2)]
    results = finish(*nodes)
    for rc, out, err in results:
        assert rc == 0, out + err
    [run] = run_dirs(out_root)
    assert run.name == "el2_smoke_w2"
    joined = [i for i, (_, out, _) in enumerate(results) if "opened" in out and "first: joining it" in out]
    assert len(joined) == 1, [r[1] for r in results]
    opener = nodes[1 - joined[0]]
    manifest, summary = load_json(run / "run.json"), load_json(run / "summary.json")
    assert manifest["driver"]["pid"] == opener.pid, "the driver that opened it writes run.json"
    assert manifest["status"] == summary["status"] == "completed"
    assert summary["completion"]["completed_ranks"] == [0, 1]
    host = socket.gethostname()
    assert sorted(manifest["nodes"]) == sorted(f"{host}-{p.pid}" for p in nodes)
    assert all(n["torchrun_exit_code"] == 0 and n["node_rank"] is None for n in manifest["nodes"].values())
