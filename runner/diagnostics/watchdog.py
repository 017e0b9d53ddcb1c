"""The driver's hang watchdog: finds a rank that has made no progress for ``watchdog.timeout_s``, saves every rank's
stacks, names the rank behind, and ends the run. It also watches the ranks' processes for the root cause.

Ranks report their optimizer step and phase in ``logs/progress/rank<R>.json`` (tasks/engine/diagnostics/
heartbeat.py). :meth:`Watchdog.tick` runs on the supervisor's tick (about every 0.5 s) and reads those small files.
A rank is judged once some rank has finished a step of this launch (start-up and compilation can take minutes).
When one has not changed for ``timeout_s``:

1. every rank's Python stacks, all threads: SIGUSR1, on which each rank's faulthandler writes
   ``logs/stacks/rank<R>.txt``. A stopped rank (SIGSTOP; state ``T``) cannot run a handler: the record says it
   was stopped, and its stack is written when the watchdog resumes it (SIGCONT) to end the run: the frames it was
   stopped in, since a pending signal is handled before it runs any further;
2. native frames with ``py-spy dump`` when that tool is installed (optional);
3. on NCCL, each rank dumps NCCL's flight recorder (best effort, ``logs/stacks/rank<R>.nccl_trace.pkl``);
4. ``logs/hang.json``: the rank behind, its step, phase and top frame, every rank's state; one console line;
5. SIGTERM to torchrun (its usual stop path), SIGKILL if it has not ended after ``END_GRACE_S``.

Under a remote root with several nodes, the other nodes' ranks are read from the run tree (peers.py): their
records, with ``PeerRanks.lag_s`` more time, and their stacks, waited for before torchrun is stopped here.

Standard library and psutil only (the driver never imports torch at start-up).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from ddp_runner.contract import layout
from ddp_runner.contract.osutil import atomic_write

if TYPE_CHECKING:
    from ddp_runner.diagnostics.peers import PeerRanks

# Phases in the order a rank goes through them between two completed optimizer steps (heartbeat ``step`` counts
# completed steps, so the bookkeeping after step k comes before the work of step k+1).
PHASE_ORDER = ("step_end", "log", "validation", "checkpoint", "data", "forward_backward", "sync", "optimizer",
               "finish")
IDLE_PHASES = ("startup", "done", "terminated")  # never judged: not started, or leaving
STACK_WAIT_S = 3.0    # for the ranks' faulthandler output
NCCL_WAIT_S = 5.0     # for the ranks' NCCL flight recorder dumps (their progress thread polls once a second)
PYSPY_TIMEOUT_S = 10.0
END_GRACE_S = 25.0    # torchrun's own grace is 30 s; the driver's supervisor gives 20 s on Ctrl-C

_THREAD = re.compile(r"^(?:Current thread|Thread) (0x[0-9a-f]+) \(most recent call first\):", re.M)
_FRAME = re.compile(r'^\s+File "([^"]+)", line (\d+) in (\S+)', re.M)


def read_progress(local_dir: str, world_size: int) -> dict[int, dict[str, Any]]:
    """Every rank's last progress record (missing or half-written ones are absent)."""
    out: dict[int, dict[str, Any]] = {}
    for r in range(world_size):
        with contextlib.suppress(OSError, ValueError):
            out[r] = json.loads(Path(local_dir, layout.rank_progress(r)).read_text())
    return out


def top_frame(stack_text: str, thread_ident: int | None) -> str | None:
    """``file:line in function`` of the innermost frame of thread ``thread_ident`` (the main thread) in a
    faulthandler dump; the first thread's when that one is not found."""
    blocks = list(_THREAD.finditer(stack_text))
    chosen = None
    for i, m in enumerate(blocks):
        if thread_ident is not None and int(m.group(1), 16) == thread_ident:
            chosen = i
    if chosen is None and blocks:
        chosen = 0
    if chosen is None:
        return None
    end = blocks[chosen + 1].start() if chosen + 1 < len(blocks) else len(stack_text)
    frame = _FRAME.search(stack_text, blocks[chosen].end(), end)
    return f"{frame.group(1)}:{frame.group(2)} in {frame.group(3)}" if frame else None


def _zombie_exit(pid: int) -> int | None:
    """A dead, not yet reaped process's exit code as subprocess reports it (negative: killed by that signal), from
    /proc/<pid>/stat (field 52, Linux 3.5+); None when unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        status = int(stat.rsplit(")", 1)[1].split()[49])
    except (OSError, ValueError, IndexError):
        return None
    return -(status & 0x7F) if status & 0x7F else (status >> 8) & 0xFF


def oom_kills() -> int | None:
    """The kernel OOM killer's count for this process's cgroup (v2 memory.events), None where not readable."""
    try:
        line = Path("/proc/self/cgroup").read_text().strip().splitlines()[0]
        events = Path("/sys/fs/cgroup", line.split("::", 1)[1].lstrip("/"), "memory.events").read_text()
    except (OSError, IndexError):
        return None
    m = re.search(r"^oom_kill (\d+)$", events, re.M)
    return int(m.group(1)) if m else None


HOST = socket.gethostname()


class Watchdog:
    """Hang detection and process watch for one launch, driven by the supervisor's tick."""

    def __init__(self, local_dir: str, run_url: str, world_size: int, timeout_s: float,
                 torchrun: Callable[[], subprocess.Popen[bytes] | None], say: Callable[[str], None] | None = None,
                 nccl: bool = False, peers: PeerRanks | None = None) -> None:
        self.local_dir, self.run_url, self.world_size, self.timeout_s = local_dir, run_url, world_size, timeout_s
        self.torchrun, self.nccl, self.peers = torchrun, nccl, peers
        self.remote: set[int] = set()  # ranks whose records come from the run tree (other nodes, remote root)
        self.say = say or (lambda line: print(line, file=sys.stderr, flush=True))
        self.seen: dict[int, tuple[int, float]] = {}  # rank -> (seq, monotonic time it was first seen)
        self.progress: dict[int, dict[str, Any]] = {}
        self.procs: dict[int, psutil.Process] = {}
        self.gone: dict[int, dict[str, Any]] = {}  # rank -> {time, exit_code}
        self.hang: dict[str, Any] | None = None
        self.ended_at: float | None = None
        self.oom_kills_before = oom_kills()

    # -- every tick -------------------------------------------------------------------------------------

    def tick(self, judge: bool = True) -> None:
        """Read the ranks' progress, note processes that ended, and (``judge``) act on a hang."""
        now = time.monotonic()
        self.progress = read_progress(self.local_dir, self.world_size)
        if self.peers is not None:
            copies = self.peers.progress(r for r in range(self.world_size) if r not in self.progress)
            self.progress.update(copies)
            self.remote = set(copies)
        for r, p in self.progress.items():
            if self.seen.get(r, (None,))[0] != p.get("seq"):
                self.seen[r] = (p.get("seq"), now)
            # A pid means something only on its own host (a multi-node run's ranks share the progress folder).
            if r not in self.procs and isinstance(p.get("pid"), int) and p.get("host", HOST) == HOST:
                with contextlib.suppress(psutil.Error):
                    self.procs[r] = psutil.Process(p["pid"])
        self._watch_processes()
        if self.hang is not None or self.ended_at is not None:
            self._escalate(now)
        elif judge and self.timeout_s > 0 and (stale := self._stale(now)):
            failed = [r for r in range(self.world_size) if Path(self.local_dir, layout.rank_error(r)).exists()]
            if not failed and self.peers is not None:
                failed = self.peers.failed(sorted(self.remote))
            if failed:  # not a hang: a rank failed and the run is slow to end (a teardown waiting on a peer)
                self._end(f"rank {failed[0]} failed and the run has not ended {self.timeout_s:g} s later")
            else:
                self._on_hang(stale, now)

    def _watch_processes(self) -> None:
        for r, proc in self.procs.items():
            if r in self.gone:
                continue
            try:
                dead = proc.status() == psutil.STATUS_ZOMBIE
            except psutil.NoSuchProcess:
                dead = True
            except psutil.Error:
                dead = False
            if dead:
                self.gone[r] = {"time": time.time(), "exit_code": _zombie_exit(proc.pid)}

    def _stale(self, now: float) -> list[int]:
        live = {r: p for r, p in self.progress.items() if r not in self.gone and p.get("phase") not in IDLE_PHASES}
        if not any(p.get("step", 0) > p.get("start_step", 0) for p in self.progress.values()):
            return []  # nobody has finished a step of this launch yet
        lag = self.peers.lag_s if self.peers is not None else 0.0
        return [r for r in live if now - self.seen[r][1] >= self.timeout_s + (lag if r in self.remote else 0.0)]

    def _end(self, why: str) -> None:
        """SIGTERM to torchrun (its stop path); SIGKILL follows after END_GRACE_S."""
        self.say(f"ddp-run: watchdog: {why}; ending it")
        proc = self.torchrun()
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        self.ended_at = time.monotonic()

    def _escalate(self, now: float) -> None:
        proc = self.torchrun()
        if self.ended_at is not None and proc is not None and proc.poll() is None and now - self.ended_at > END_GRACE_S:
            self.say(f"ddp-run: watchdog: torchrun did not stop within {END_GRACE_S:.0f} s; killing it")
            proc.kill()
            self.ended_at = float("inf")

    # -- a hang -----------------------------------------------------------------------------------------

    def _status(self, r: int) -> str | None:
        try:
            return self.procs[r].status() if r in self.procs else None
        except psutil.Error:
            return None

    def _behind(self, stale: list[int], stopped: list[int], frames: dict[int, str | None]) -> int:
        """The rank the others wait for: a stopped one; else the least progress (step, then phase); else one not
        waiting inside torch.distributed; else the one whose phase began first."""
        def key(r: int) -> tuple[int, int, int, int, float]:
            p = self.progress[r]
            phase = p.get("phase")
            order = PHASE_ORDER.index(phase) if phase in PHASE_ORDER else len(PHASE_ORDER)
            waiting = "torch/distributed/" in (frames.get(r) or "")
            return (0 if r in stopped else 1, int(p.get("step", 0)), order, int(waiting), float(p.get("since", 0.0)))

        candidates = [r for r in self.progress if r not in self.gone and self.progress[r].get("phase")
                      not in IDLE_PHASES] or stale
        return min(candidates, key=key)

    def _on_hang(self, stale: list[int], now: float) -> None:
        stopped = [r for r in self.procs if r not in self.gone and self._status(r) == psutil.STATUS_STOPPED]
        stacks = Path(self.local_dir, layout.STACKS)
        stacks.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):
            (stacks / Path(layout.DUMP_REQUEST).name).touch()  # NCCL ranks dump their flight recorder
        if self.peers is not None:  # the other nodes' drivers copy it to their ranks
            self.peers.request_dump()
        for r, proc in self.procs.items():
            if r not in self.gone:
                with contextlib.suppress(psutil.Error):
                    proc.send_signal(signal.SIGUSR1)  # a stopped rank handles it when resumed
        native = self._py_spy()
        if self.nccl:  # the flight recorder is dumped by each rank's progress thread: give it time before SIGTERM
            self._wait_for_nccl_traces([r for r in self.procs if r not in self.gone and r not in stopped])
        # The other nodes' ranks write their stacks only while they run: before this node's end ends theirs.
        frames = self._wait_for_peer_stacks()
        # End the run (torchrun's stop path), and resume stopped ranks: their pending SIGUSR1 writes their stack
        # from where they were stopped, then SIGTERM stops them.
        proc = self.torchrun()
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        self.ended_at = time.monotonic()
        for r in stopped:
            with contextlib.suppress(psutil.Error):
                self.procs[r].send_signal(signal.SIGTERM)
                self.procs[r].resume()
        frames.update(self._wait_for_stacks())
        rank = self._behind(stale, stopped, frames)
        p = self.progress[rank]
        states = {str(r): {"step": q.get("step"), "phase": q.get("phase"), "pid": q.get("pid"),
                           "no_progress_s": round(self._idle(r, now), 1) if r in self.seen else None,
                           "stopped": r in stopped, "top_frame": frames.get(r),
                           "stack": layout.rank_stack(r) if frames.get(r) else None,
                           "native_stack": layout.rank_stack(r, "native") if native.get(r) == "saved"
                           else "on another node: py-spy runs on this one's" if r in self.remote
                           else native.get(r, "py-spy not installed")}
                  for r, q in sorted(self.progress.items())}
        idle = round(self._idle(rank, now), 1)
        state = "stopped (SIGSTOP: it cannot run a signal handler)" if rank in stopped else "not stopped"
        self.hang = {
            "rank": rank, "time": time.time(), "step": p.get("step"), "phase": p.get("phase"),
            "no_progress_s": idle, "timeout_s": self.timeout_s, "stopped": rank in stopped,
            "top_frame": frames.get(rank), "stacks": layout.STACKS, "ranks": states,
            "message": (f"no progress for {idle:.0f} s (watchdog.timeout_s={self.timeout_s:g}) after step"
                        f" {p.get('step')}, in phase {p.get('phase')}; process {state}"),
        }
        with contextlib.suppress(OSError):
            atomic_write(Path(self.local_dir, layout.HANG_RECORD), json.dumps(self.hang, indent=2))
        self.say(f"ddp-run: HANG: rank {rank} made no progress for {idle:.0f} s (step {p.get('step')}, phase"
                 f" {p.get('phase')}{', stopped by SIGSTOP' if rank in stopped else ''}); top frame:"
                 f" {frames.get(rank) or 'unknown'}; stacks: {layout.join(self.run_url, layout.STACKS)}."
                 " Ending the run.")

    def _idle(self, r: int, now: float) -> float:
        """Seconds without progress: since this watch saw the record change; for another node's rank, whose copy
        arrives late, since its phase began on its own host when that is longer (by at most the copies' lag, in
        case the hosts' clocks differ)."""
        seen = now - self.seen[r][1]
        if r not in self.remote or self.peers is None:
            return seen
        began = time.time() - float(self.progress[r].get("since", time.time()))
        return max(seen, min(began, seen + self.peers.lag_s))

    def _py_spy(self) -> dict[int, str]:
        """Native and Python frames of every live rank with py-spy, when installed (on PATH or beside this Python):
        rank -> ``saved``, or why not (py-spy may lack ptrace permission, or not know this Python build)."""
        exe = shutil.which("py-spy") or shutil.which("py-spy", path=os.path.dirname(sys.executable))
        if exe is None:
            return {}
        running = {}
        for r, proc in self.procs.items():
            if r in self.gone:
                continue
            path = Path(self.local_dir, layout.rank_stack(r, "native"))
            out = open(path, "w")  # noqa: SIM115 - closed below
            running[r] = (subprocess.Popen([exe, "dump", "--native", "--pid", str(proc.pid)], stdout=out,
                                           stderr=subprocess.STDOUT), out, path)
        deadline = time.monotonic() + PYSPY_TIMEOUT_S
        result: dict[int, str] = {}
        for r, (p, out, path) in running.items():
            try:
                rc = p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                rc = p.wait()
            out.close()
            if rc == 0:
                result[r] = "saved"
            else:  # keep the reason, not a file of error text beside the stacks
                lines = path.read_text(errors="replace").strip().splitlines()
                result[r] = f"py-spy failed (exit {rc}): {lines[-1] if lines else 'no output'}"
                path.unlink(missing_ok=True)
        return result

    def _wait_for_nccl_traces(self, ranks: list[int]) -> None:
        """Until every running rank has written NCCL's flight recorder (up to NCCL_WAIT_S)."""
        deadline = time.monotonic() + NCCL_WAIT_S
        while time.monotonic() < deadline and not all(
                Path(self.local_dir, layout.rank_stack(r, "nccl")).exists() for r in ranks):
            time.sleep(0.2)

    def _wait_for_stacks(self) -> dict[int, str | None]:
        """Each of this node's ranks' top frame (main thread) once its faulthandler dump is there (up to
        STACK_WAIT_S)."""
        def read(r: int) -> str | None:
            with contextlib.suppress(OSError):
                return Path(self.local_dir, layout.rank_stack(r)).read_text(errors="replace")
            return None

        local = [r for r in self.progress if r not in self.remote]
        return self._wait_for_frames(local, read, STACK_WAIT_S, 0.2)

    def _wait_for_peer_stacks(self) -> dict[int, str | None]:
        """The other nodes' ranks' top frames, from the stacks their drivers mirror (up to STACK_WAIT_S + the
        copies' lag); the stack files themselves reach this run directory with the other nodes' logs."""
        if self.peers is None or not self.remote:
            return {}
        return self._wait_for_frames(sorted(self.remote), self.peers.stack, STACK_WAIT_S + self.peers.lag_s, 0.5)

    def _wait_for_frames(self, ranks: list[int], read: Callable[[int], str | None], wait_s: float,
                         interval_s: float) -> dict[int, str | None]:
        """Poll ``read`` (a rank's stack text, or None while it is not there) until every running one of
        ``ranks`` has a top frame, or ``wait_s`` has passed."""
        deadline = time.monotonic() + wait_s
        frames: dict[int, str | None] = {}
        while True:
            for r in ranks:
                if frames.get(r) is None and (text := read(r)) is not None:
                    frames[r] = top_frame(text, self.progress[r].get("main_thread"))
            if all(frames.get(r) for r in ranks if r not in self.gone) or time.monotonic() > deadline:
                return frames
            time.sleep(interval_s)

    def observations(self) -> dict[str, Any]:
        """What the root cause needs from this watch: the hang, processes seen ending, OOM-killer evidence."""
        after = oom_kills()
        return {"hang": self.hang, "gone": self.gone,
                "oom_kills": (after - self.oom_kills_before) if after is not None and self.oom_kills_before
                is not None else None}
