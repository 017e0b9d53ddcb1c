"""Ranks forked from the agent's preloaded server, through the real CLI (one launch): the process tree is driver →
torchrun's agent → the server → the ranks (named ``ddp-rank<R>``, the pids their fact files give), each with its
own RANK, training with a DataLoader worker each; and when the agent is SIGKILLed while the driver cannot help
(stopped), the server and the ranks die with it: no orphan. The worker's command itself still runs under plain
torchrun (its SubprocessContext: a fresh interpreter per rank), as any launcher of the recorded command would run
it."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from ddp_runner.contract import layout
from tests.support.run_tree import load_json
from tests.support.waiting import wait_for


def _children(p: psutil.Process) -> list[psutil.Process]:
    try:
        return p.children()
    except psutil.Error:
        return []


def test_ranks_are_forks_of_the_agents_server_and_die_with_the_agent(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with open(tmp_path / "driver.log", "wb") as log:
        driver = subprocess.Popen([sys.executable, "-m", "ddp_runner", "task=smoke", "world_size=2", "device=cpu",
                                   "train.max_steps=1000000", "train.log_every=1000", "train.num_workers=1",
                                   f"output.root={out}"],
                                  stdout=log, stderr=log)
    stopped = False
    try:
        facts = wait_for("both ranks' fact files", lambda: _exactly(2, sorted(out.rglob("logs/rank*.json"))),
                         timeout=240, driver=driver)
        pids = {json.loads(f.read_text())["rank"]: json.loads(f.read_text())["pid"] for f in facts}
        [run] = {f.parents[1] for f in facts}
        # Training goes on: each forked rank started its DataLoader's worker process (through multiprocessing,
        # in a process forked from the agent: no lock of the agent's may be inherited held).
        wait_for("both ranks past step 2", lambda: all(
            (load_json(run / layout.rank_progress(r)) if (run / layout.rank_progress(r)).exists() else {}).get(
                "step", 0) >= 2 for r in (0, 1)), timeout=120, driver=driver)
        for pid in pids.values():  # its worker is a fork of the rank, as under a fresh interpreter's default
            workers = _children(psutil.Process(pid))
            assert len(workers) == 1 and "forkserver" not in " ".join(workers[0].cmdline()), \
                [w.cmdline() for w in workers]
        [agent] = _children(psutil.Process(driver.pid))
        [server] = [p for p in _children(agent) if {q.pid for q in _children(p)} == set(pids.values())]
        for rank, pid in pids.items():
            assert psutil.Process(pid).name() == f"ddp-rank{rank}"
            assert psutil.Process(pid).ppid() == server.pid
        assert {json.loads((run / layout.rank_facts(r)).read_text())["rank"] for r in pids} == {0, 1}

        driver.send_signal(signal.SIGSTOP)  # its reaper would end the ranks; here they must end by themselves
        stopped = True
        ranks = [psutil.Process(pid) for pid in pids.values()]
        t0 = time.monotonic()
        agent.kill()
        _, alive = psutil.wait_procs([server, *ranks], timeout=60)
        assert alive == [], f"outlived the agent: {alive}"
        print(f"server and ranks gone {time.monotonic() - t0:.1f} s after the agent was killed")
    finally:
        if stopped:
            driver.send_signal(signal.SIGCONT)
        try:
            driver.wait(timeout=120)
        except subprocess.TimeoutExpired:
            driver.kill()
            driver.wait()
    assert driver.returncode != 0


def _exactly(n: int, items: list) -> list | None:
    return items if len(items) == n else None


def test_the_recorded_command_still_runs_its_ranks_under_plain_torchrun(smoke_reference: Path, tmp_path: Path) -> None:
    """``python -P -u -m ddp_runner.tasks <run dir>`` is the worker's command in run.json; plain torchrun (not this
    package's agent) runs it as a command on every rank. A copy of the shared smoke run continues from its last
    checkpoint (step 8 of 8) and both ranks end completed."""
    run = tmp_path / "run"
    shutil.copytree(smoke_reference, run)
    for facts in run.glob("logs/rank*.json"):
        facts.unlink()
    command = load_json(run / layout.MANIFEST)["command"]
    agent = command.index("ddp_runner.launch.agent")
    cmd = [*command[:agent], "torch.distributed.run", *command[agent + 1:-1], str(run)]
    assert cmd[-3:-1] == ["-m", "ddp_runner.tasks"] and "--no-python" in cmd
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    for rank in (0, 1):
        facts = load_json(run / layout.rank_facts(rank))
        assert facts["completed"] and facts["exit_code"] == 0, facts
        assert f"rank {rank} device cpu:{rank} completed" in (run / layout.rank_log(rank)).read_text()
