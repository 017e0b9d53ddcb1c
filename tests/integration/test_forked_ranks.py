"""Ranks forked from a preloaded server (runner/launch/forkserver.py, tasks/preload.py, tasks/forked.py), without a
launch: what the server imports touches no CUDA and starts no thread; the agent hands torchrun this package's
worker as a forked function and every other command as it was; a failure reports every rank's exit code, as
torchrun's SubprocessContext does; a rank's OMP_NUM_THREADS rules over the server's."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from ddp_runner.contract import layout
from ddp_runner.launch import forkserver

# Run in a fresh interpreter, as the server is: torch imported, every CUDA entry point that would initialise the
# CUDA driver (or count devices through it) replaced by a spy, then the rest of the preload imported.
_PRELOAD_PROBE = """
import gc, json, os, signal, sys, threading
import torch
calls = []
def spy(name, real):
    def call(*args, **kwargs):
        calls.append(name)
        return real(*args, **kwargs)
    return call
for name in ("is_available", "device_count", "init", "_lazy_init", "current_device", "set_device",
             "get_device_properties", "get_device_capability", "get_device_name", "synchronize", "mem_get_info"):
    setattr(torch.cuda, name, spy(name, getattr(torch.cuda, name)))
import ddp_runner.tasks.preload as preload
agent = {"calls": calls, "initialized": torch.cuda.is_initialized(), "threads": threading.active_count(),
         "tasks": len(os.listdir("/proc/self/task")),
         "missing": [m for m in preload.MODULES if m not in sys.modules], "frozen": gc.get_freeze_count(),
         "collecting": gc.isenabled(), "sigterm_ignored": signal.getsignal(signal.SIGTERM) == signal.SIG_IGN,
         "marker_left": "DDP_RUNNER_FORKSERVER" in os.environ}
r, w = os.pipe()
pid = os.fork()
if pid == 0:  # what the agent's fork of the server does first (runner/launch/forkserver.py)
    preload.become_server()
    os.write(w, json.dumps({"frozen": gc.get_freeze_count(), "pid_is_server": preload._SERVER == os.getpid(),
                            "sigterm_ignored": signal.getsignal(signal.SIGTERM) == signal.SIG_IGN}).encode())
    os._exit(0)
os.close(w)
server = json.loads(os.read(r, 65536))
os.waitpid(pid, 0)
print(json.dumps({"agent": agent, "server": server}), flush=True)
"""


def test_the_preload_initialises_no_cuda_and_starts_no_thread() -> None:
    """The agent imports the preload, then forks the server that forks every rank: a CUDA context (or the CUDA
    driver, which a device count initialises) made before the fork is unusable in the ranks on a GPU host ("Cannot
    re-initialize CUDA in forked subprocess"), and a fork copies only the calling thread. On a GPU host
    ``initialized`` is the real CUDA state; on any host the spies see any call of the preload into torch.cuda's
    device queries. The agent keeps SIGTERM its own, with what the imports made out of the collector's reach and
    the collector on again; the server, once it became one, has its heap frozen and ignores SIGTERM."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", layout.ENV_FORKSERVER: layout.FORKSERVER_AGENT}  # as the agent
    out = subprocess.run([sys.executable, "-P", "-c", _PRELOAD_PROBE], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0 and out.stdout.strip(), out.stderr
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    agent, server = seen["agent"], seen["server"]
    assert agent["missing"] == [], "every module of the preload imported (a failed one would hide what it does)"
    assert agent["calls"] == [] and agent["initialized"] is False, agent
    assert agent["threads"] == 1 and agent["tasks"] == 1, agent  # with the driver's OMP_NUM_THREADS=1 (no pool)
    assert not agent["sigterm_ignored"], "the agent is not prepared as a server"
    assert agent["frozen"] > 100_000 and agent["collecting"], "the imports' heap frozen, the collector on again"
    assert not agent["marker_left"], "the ranks do not inherit the marker"
    assert server["frozen"] > 0, "the preloaded heap is frozen (the ranks' collections leave its pages shared)"
    assert server["sigterm_ignored"], "a SIGTERM to the process group is for the ranks, not the server"
    assert server["pid_is_server"], "the server's exit skips the teardown; the agent's and a rank's do not"


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch):
    """forkserver.install() in this process, undone afterwards."""
    import torch.distributed.elastic.multiprocessing as elastic_mp
    import torch.distributed.run as torchrun

    monkeypatch.setattr(torchrun, "config_from_args", torchrun.config_from_args)
    monkeypatch.setattr(elastic_mp, "MultiprocessContext", elastic_mp.MultiprocessContext)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    forkserver.install()
    return torchrun, elastic_mp


def test_the_agent_forks_this_packages_worker_and_runs_any_other_command_as_torchrun_would(installed) -> None:
    from ddp_runner.tasks import forked

    torchrun, _ = installed
    base = ["--nnodes=1", "--nproc-per-node=2", "--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:0"]
    ours = [*base, *forkserver.worker_tail("/runs/r1")]
    assert forkserver.run_dir_of(ours) == "/runs/r1"
    config, entry, args = torchrun.config_from_args(torchrun.parse_args(ours))
    assert (config.start_method, entry, args) == ("forkserver", forked.rank, ["/runs/r1"])
    assert entry.__name__ == "ddp_runner.tasks", "torchrun's report names the ranks as it named the command"
    other = [*base, "--no-python", sys.executable, "-u", "train.py", "--lr=1"]
    assert forkserver.run_dir_of(other) is None
    config, entry, args = torchrun.config_from_args(torchrun.parse_args(other))
    assert (config.start_method, entry, args) == ("spawn", sys.executable, ["-u", "train.py", "--lr=1"])


def _rank_body(local_rank: int, ready: str) -> None:
    """Rank 1 fails with exit code 3 once rank 0 is set up (the file ``ready``); rank 0 works until torchrun stops
    it (SIGTERM, its default action)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # forked from this process: not the handler torchrun set here
    if local_rank == 1:
        deadline = time.monotonic() + 60
        while not os.path.exists(ready) and time.monotonic() < deadline:
            time.sleep(0.01)
        sys.exit(3)
    open(ready, "w").close()  # the stop now finds SIGTERM's default action, not this process's handler
    time.sleep(60)


def test_a_failure_reports_every_ranks_exit_code(installed, tmp_path) -> None:
    """MultiprocessContext alone reports the first failed rank only; the driver reads every rank's code from
    torchrun's report (runner/supervise/finalize.py), so the rank that the stop ended is reported too (-15)."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs

    _, elastic_mp = installed
    ready = str(tmp_path / "rank0-ready")
    pc = elastic_mp.start_processes(name="t", entrypoint=_rank_body, args={0: (0, ready), 1: (1, ready)},
                                    envs={0: {}, 1: {}},
                                    logs_specs=DefaultLogsSpecs(log_dir=str(tmp_path)), start_method="fork")
    result = pc.wait(timeout=60, period=0.1)
    assert result is not None and result.is_failed()
    assert {r: f.exitcode for r, f in result.failures.items()} == {0: -15, 1: 3}


def test_a_ranks_omp_num_threads_rules_over_the_servers(monkeypatch) -> None:
    """OpenMP read OMP_NUM_THREADS when the server imported torch; torchrun sets the rank's own before it runs."""
    import torch

    from ddp_runner.tasks import forked

    before = torch.get_num_threads()
    try:
        monkeypatch.setenv("OMP_NUM_THREADS", str(before + 1))
        forked._threads_from_env()
        assert torch.get_num_threads() == before + 1
    finally:
        torch.set_num_threads(before)
