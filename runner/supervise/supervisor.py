"""Start torchrun (any launcher's command) and supervise it to the end.

torchrun's elastic agent starts, restarts and tears down the workers; the driver adds what it lacks:
a clean stop on Ctrl-C/SIGTERM (or the pre-emption signal) that leaves no process behind, and a readable root cause.

A first signal is forwarded (SIGTERM to torchrun, which passes it to the workers: they agree at the next
optimizer step, save a complete checkpoint and end); the workers get the stop grace plus a margin before they are
killed. A second signal stops everything at once, without waiting for the checkpoint.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

import psutil

from ddp_runner.config import bytecode
from ddp_runner.contract import layout, stops
from ddp_runner.contract.osutil import die_with_parent, handle_signals, restore_signals
from ddp_runner.supervise import reaper
from ddp_runner.supervise.agent_dir import temp_dir as agent_temp_dir
from ddp_runner.supervise.stop import guard

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


def _detach_terminal() -> None:
    """After SIGHUP the terminal is gone and writing to it fails (EIO): the console goes to /dev/null from here
    on (the run's own files say everything). Output sent to a file or pipe is left as it is."""
    null = None
    for fd in (1, 2):
        try:
            if os.isatty(fd):
                null = os.open(os.devnull, os.O_WRONLY) if null is None else null
                os.dup2(null, fd)
        except OSError:
            pass
    if null is not None:
        os.close(null)


class Supervisor:
    """Runs torchrun as the driver's child and guarantees that no process outlives the run."""

    def __init__(self, cmd: list[str], env: dict[str, str], agent_log: str, preempt: int | None = None,
                 grace_s: float = stops.DEFAULT_GRACE_S, request_file: str | None = None) -> None:
        self.cmd, self.env, self.agent_log = cmd, env, agent_log
        # Where to ask the ranks to stop instead of signalling (srun cancels its step on a signal), if anywhere.
        self.request_file = request_file
        self.preempt, self.grace_s = preempt, grace_s + stops.DRIVER_MARGIN_S
        self.proc: subprocess.Popen[bytes] | None = None
        self.interrupted: int | None = None

    def _on_signal(self, signum: int, _frame: Any) -> None:
        if signum == signal.SIGHUP:
            _detach_terminal()
        alive = self.proc is not None and self.proc.poll() is None
        if self.interrupted is not None:  # a second signal: at once, without the checkpoint
            print(f"ddp-run: {stops.signal_name(signum)} again: stopping at once, without the checkpoint on stop",
                  file=sys.stderr, flush=True)
            if alive:
                self.proc.kill()  # the workers die with torchrun (their parent-death signal is SIGKILL)
            return
        # Said at once: stopping can take seconds, and silence invites a second Ctrl-C.
        print(f"ddp-run: stopping on {stops.signal_name(signum)}: every rank saves a checkpoint of its last optimizer"
              " step, at the next step boundary or, after the last step, at once (up to"
              f" {self.grace_s - stops.DRIVER_MARGIN_S:.0f} s, checkpoint.stop_grace_s); press Ctrl-C again to stop at"
              " once without it", file=sys.stderr, flush=True)
        self.interrupted = signum
        if self.request_file is not None:
            with open(self.request_file, "w") as f:  # rank 0 reads it within a second; the signal follows the grace
                json.dump({"signal": signum}, f)
        elif alive:
            self.proc.send_signal(signal.SIGTERM)  # torchrun's agent then stops its workers

    def run(self, on_tick: Callable[[], None] | None = None) -> int:
        """Start torchrun, wait for it, and return its exit code (negative for a signal).

        ``on_tick`` is called about every half second while it runs (e.g. to mirror logs remotely).
        """
        # SIGHUP (the terminal or ssh session closed) is a stop like SIGTERM: the run ends with its checkpoint.
        handled = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP} | ({self.preempt} if self.preempt else set())
        if self.request_file is not None and os.path.exists(self.request_file):  # an earlier attempt's
            os.remove(self.request_file)
        old = handle_signals(handled, self._on_signal)
        try:
            if (early := guard.take()) is not None:  # came as the launch was recorded: torchrun never starts
                if early == signal.SIGHUP:
                    _detach_terminal()
                guard.say(f"ddp-run: stopped by {stops.signal_name(early)} before torchrun started")
                self.interrupted = early  # the run is recorded interrupted, as if its ranks had stopped at once
                return -early
            with open(self.agent_log, "ab") as log:
                # torchrun's own chatter goes to logs/torchrun.log; rank 0's console output keeps stdout.
                self.env[layout.ENV_LAUNCH_T] = repr(time.time())
                self.proc = subprocess.Popen(self.cmd, env=self.env, stderr=log, start_new_session=True,
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
                            rc = self._stop(tree)
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

    def _stop(self, tree: list[psutil.Process]) -> int:
        assert self.proc is not None
        deadline = time.monotonic() + self.grace_s
        while time.monotonic() < deadline and self.proc.poll() is None:
            time.sleep(0.2)
        if self.request_file is not None and self.proc.poll() is None:  # asked, not signalled: now the signal
            self.proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and self.proc.poll() is None:
                time.sleep(0.2)
        if self.proc.poll() is None:
            self.proc.kill()
        return self.proc.wait()
