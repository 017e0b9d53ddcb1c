"""Start torchrun (any launcher's command) and supervise it to the end.

torchrun's elastic agent starts, restarts and tears down the workers; the driver adds what it lacks:
a clean stop on Ctrl-C/SIGTERM (or the pre-emption signal) that leaves no process behind, and a readable root cause.

While torchrun runs, the stop signals are handled as runner/supervise/stop/forward.py says (the first one asks
every rank to save and stop, a second one stops everything at once); once it has gone, the reaper ends any worker
left (runner/supervise/reaper.py).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Mapping

import psutil

from ddp_runner.config import bytecode
from ddp_runner.contract import layout, stops
from ddp_runner.contract.osutil import die_with_parent, handle_signals, restore_signals
from ddp_runner.supervise import reaper
from ddp_runner.supervise.agent_dir import temp_dir as agent_temp_dir
from ddp_runner.supervise.stop.forward import TorchrunStop

GRACE_S = stops.DEFAULT_GRACE_S + stops.DRIVER_MARGIN_S  # after SIGTERM, before SIGKILL (inside torchrun's 30 s)


def worker_env(run_url: str, local_dir: str, t0: float, restarts: int = 0,
               task_path: str | None = None, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment torchrun and its workers get. ``extra``: the launcher's variables (e.g. the interface
    gloo and NCCL listen on), each added only where the user has not set it."""
    env = dict(os.environ)
    for k, v in (extra or {}).items():
        env.setdefault(k, v)
    if restarts:
        # torchrun shares its rendezvous TCPStore with the workers and does not separate restart attempts in
        # it: restarted gloo/NCCL ranks read the previous attempt's addresses and fail to connect
        # (pytorch/pytorch#135712). Not sharing it gives every attempt a fresh store.
        env.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    for k, v in layout.SAFE_ENV.items():
        env.setdefault(k, v)
    env[layout.ENV_RUN_DIR] = run_url
    env[layout.ENV_LOCAL_DIR] = local_dir
    env[layout.ENV_T0] = repr(t0)
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("OMP_NUM_THREADS", "1")  # what torchrun would pick, without its warning
    if task_path:
        env[layout.ENV_TASK_PATH] = task_path
    else:
        env.pop(layout.ENV_TASK_PATH, None)
    return bytecode.child_env(env)


def _torchrun_dies_with_us() -> None:  # runs in the child between fork and exec
    die_with_parent(signal.SIGTERM)  # torchrun's agent then stops its workers


class Supervisor:
    """Runs torchrun as the driver's child and guarantees that no process outlives the run."""

    def __init__(self, cmd: list[str], env: dict[str, str], agent_log: str, preempt: int | None = None,
                 grace_s: float = stops.DEFAULT_GRACE_S, request_file: str | None = None) -> None:
        self.cmd, self.env, self.agent_log = cmd, env, agent_log
        self.stop = TorchrunStop(preempt, grace_s, request_file)

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        """torchrun, once started."""
        return self.stop.proc

    @property
    def interrupted(self) -> int | None:
        """The signal that stopped the run, or None."""
        return self.stop.interrupted

    def run(self, on_tick: Callable[[], None] | None = None) -> int:
        """Start torchrun, wait for it, and return its exit code (negative for a signal).

        ``on_tick`` is called about every half second while it runs (e.g. to mirror logs remotely).
        """
        self.stop.forget_earlier_request()
        old = handle_signals(self.stop.signals(), self.stop.on_signal)
        try:
            if (early := self.stop.taken_early()) is not None:  # came as the launch was recorded
                return -early
            with open(self.agent_log, "ab") as log:
                # torchrun's own chatter goes to logs/torchrun.log; rank 0's console output keeps stdout.
                self.env[layout.ENV_LAUNCH_T] = repr(time.time())
                self.stop.proc = subprocess.Popen(self.cmd, env=self.env, stderr=log, start_new_session=True,
                                                  preexec_fn=_torchrun_dies_with_us)
                tree: list[psutil.Process] = []
                while True:
                    try:
                        rc = self.proc.wait(timeout=0.5)
                        break
                    except subprocess.TimeoutExpired:
                        tree = reaper.snapshot(self.proc.pid, tree)
                        if on_tick is not None:
                            on_tick()
                        if self.interrupted is not None:
                            rc = self.stop.wait_out()
                            break
            reaper.reap_tree(tree)
        except BaseException:  # the driver fails (an unwritable run directory): no process outlives it
            if self.proc is not None and self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            raise
        else:
            # torchrun's temporary folder, had its agent (runner/launch/agent.py) no chance to remove it.
            shutil.rmtree(agent_temp_dir(self.proc.pid), ignore_errors=True)
            return rc
        finally:
            restore_signals(old)
