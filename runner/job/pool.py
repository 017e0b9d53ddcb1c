"""A concurrent local sweep (``sweep.parallel=auto|N``): each job is its own ``ddp-run`` on its own devices.

Hydra's launcher hands the jobs over one by one (``runner/cli.py``); :meth:`Pool.start` starts each as a child
``ddp-run`` with the job's overrides as soon as a disjoint set of devices is free (:mod:`ddp_runner.job.slots`),
and returns at once: the job's objective is a :class:`~ddp_runner.job.objective.Pending` that a search sweeper
waits for when it reads it. Every child is a whole single run (plan, run directory in the sweep directory, torchrun,
summary, its own checkpoint on a stop), so a concurrent job behaves exactly as the same job run alone:

- its devices: ``CUDA_VISIBLE_DEVICES`` (GPU UUIDs), or its CPU affinity (``os.sched_setaffinity``, inherited by
  torchrun and the ranks) with ``OMP_NUM_THREADS`` = cores per rank;
- its rendezvous: each torchrun binds its own store on a free loopback port (port 0: no two jobs can collide);
- the compile cache under ``output.root`` is shared as before (inductor and Triton write entries by rename);
- Ctrl-C (or SIGTERM) reaches this driver only (the children run in sessions of their own) and is passed to every
  running job once: each one's ranks save a checkpoint and end ``interrupted``; a second Ctrl-C stops them at once.
  Jobs not started yet are recorded as not run.

While jobs run, one view (:mod:`ddp_runner.console.sweep_view`) shows each one's progress.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddp_runner.console.sweep_view import View
from ddp_runner.contract import layout
from ddp_runner.contract.osutil import die_with_parent, handle_signals, restore_signals
from ddp_runner.job.slots import Slots, gpu_peers, limit

POLL_S = 0.5
ENV_SWEEP_JOB, ENV_SWEEP_CONSOLE = layout.ENV_SWEEP_JOB, layout.ENV_SWEEP_CONSOLE


@dataclass
class Child:
    """One job started by the pool."""

    num: int
    values: dict[str, str]
    kind: str  # gpu | cpu
    ids: list[int]
    peer: bool | None
    proc: subprocess.Popen[bytes]
    files: dict[str, str]  # result, console, log
    started: float = field(default_factory=time.time)
    ended: float | None = None
    outcome: dict[str, Any] | None = None
    pruned: dict[str, Any] | None = None  # a search's pruner stopped it (its prune record)

    def placement(self) -> dict[str, Any]:
        """What sweep.json records of where and when it ran."""
        where: dict[str, Any] = {"gpus": self.ids} if self.kind == "gpu" else {"cores": self.ids}
        if self.kind == "gpu" and len(self.ids) > 1:
            where["peer_connected"] = self.peer
        return {**where, "started": self.started, "ended": self.ended, "pid": self.proc.pid}


def device_kind(conf: Mapping[str, Any], gpus: int) -> str:
    """``gpu`` or ``cpu``: what the job's ranks run on (``device=auto`` takes GPUs when there are any)."""
    device = conf.get("device", "auto")
    return "cpu" if device == "cpu" or (device == "auto" and gpus == 0) else "gpu"


def need_of(conf: Mapping[str, Any], kind: str, total: int) -> int:
    """Devices the job takes: its world size in GPUs (CPU: × ``sweep.cores_per_rank`` cores); ``world_size=auto``
    or several nodes: all of them (the plan decides, as for a single run)."""
    ws = conf.get("world_size")
    if not isinstance(ws, int) or isinstance(ws, bool) or conf.get("launcher", {}).get("nnodes", 1) not in (1, None):
        return total
    per = 1 if kind == "gpu" else int((conf.get("sweep") or {}).get("cores_per_rank") or 1)
    return ws * per


def child_argv(config_flags: Sequence[str], overrides: Sequence[str]) -> list[str]:
    """The child's command line: this package's ddp-run with the job's own overrides (no ``-m``)."""
    return [sys.executable, "-P", "-m", "ddp_runner", *config_flags, *overrides]


def read_outcome(child: Child, rc: int) -> dict[str, Any]:
    """The outcome the child wrote (code, run_dir, reason, refused), or one made from its exit code."""
    try:
        with open(child.files["result"]) as f:
            got = json.load(f)
        got.setdefault("code", rc)
        return got
    except (OSError, ValueError):
        tail = _tail(child.files["log"])
        return {"code": rc if rc else 1, "run_dir": None, "refused": False,
                "reason": f"ddp-run for this job ended ({rc}) without an outcome" + (f": {tail}" if tail else "")}


def _tail(path: str, lines: int = 3) -> str:
    try:
        return " | ".join(Path(path).read_text(errors="replace").strip().splitlines()[-lines:])[:400]
    except OSError:
        return ""


class Pool:
    """The running jobs of one concurrent sweep, on disjoint sets of devices."""

    def __init__(self, parallel: object, on_end: Callable[[Child], None],
                 gpus: Callable[[], Sequence[Any]] | None = None, cores: Sequence[int] | None = None,
                 view: View | None = None, on_poll: Callable[[Pool], None] | None = None) -> None:
        self.limit = limit(parallel)
        self.on_end = on_end
        self.on_poll = on_poll  # a search's pruner looks at the running jobs' validations (runner/job/search.py)
        self._find_gpus = gpus or _visible_gpus
        self._gpus: list[Any] | None = None
        self.cores = sorted(cores if cores is not None else os.sched_getaffinity(0))
        self.slots: dict[str, Slots] = {}
        self.running: dict[int, Child] = {}
        self.done: dict[int, Child] = {}
        self.stopping: int | None = None
        self.private = tempfile.mkdtemp(prefix="ddp-run-pool-")
        self.view = view or View()
        self._old: dict[int, Any] = {}

    # -- starting -------------------------------------------------------------------------------------------------

    def gpus(self) -> list[Any]:
        """The visible GPUs (asked once, and only when a job may run on GPUs)."""
        if self._gpus is None:
            self._gpus = list(self._find_gpus())
        return self._gpus

    def slots_for(self, kind: str) -> Slots:
        """The devices of ``kind`` (made on first use: nvidia-smi's topology is asked once)."""
        if kind not in self.slots:
            if kind == "gpu":
                self.slots[kind] = Slots("gpu", [g.physical_index for g in self.gpus()], gpu_peers())
            else:
                self.slots[kind] = Slots("cpu", list(self.cores))
        return self.slots[kind]

    def start(self, num: int, values: Mapping[str, str], argv: list[str], conf: Mapping[str, Any],
              sweep_dir: str) -> Child | None:
        """Start job ``num`` as soon as its devices are free (its progress drawn meanwhile); None when the sweep
        was stopped before it could start."""
        self._handle_signals()
        kind = "cpu" if conf.get("device") == "cpu" else device_kind(conf, len(self.gpus()))
        slots = self.slots_for(kind)
        need = need_of(conf, kind, len(slots.ids))
        while not (slots.fits(need) and (self.limit is None or len(self.running) < self.limit)):
            if self.stopping is not None:
                return None
            self.poll()
            time.sleep(POLL_S)
        if self.stopping is not None:
            return None
        ids, peer = slots.take(need)
        if peer is False:
            self.view.say(f"ddp-run: sweep: job {num}: GPUs {ids} are not peer-connected (P2P): their gradients go"
                          " through host memory; free GPUs that are connected would have been preferred")
        files = {k: os.path.join(self.private, f"job-{num}.{k}") for k in ("result", "console", "log", "prune")}
        env = dict(os.environ)
        env[ENV_SWEEP_JOB] = json.dumps({"num": num, "values": dict(values), "dir": sweep_dir,
                                         "result": files["result"]})
        env[ENV_SWEEP_CONSOLE] = files["console"]
        env[layout.ENV_PRUNE_REQUEST] = files["prune"]  # written only when a search's pruner stops the job
        if kind == "gpu":
            uuid = {g.physical_index: g.uuid for g in self.gpus()}
            env["CUDA_VISIBLE_DEVICES"] = ",".join(uuid.get(i) or str(i) for i in ids)
        else:  # each rank's intra-op threads on its own cores
            env.setdefault("OMP_NUM_THREADS", str(int((conf.get("sweep") or {}).get("cores_per_rank") or 1)))
        cores = set(ids) if kind == "cpu" else None
        with open(files["log"], "wb") as log:
            proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True, preexec_fn=lambda: _child_setup(cores))
        child = Child(num, dict(values), kind, ids, peer, proc, files)
        self.running[num] = child
        self.view.started(child)
        return child

    # -- following ------------------------------------------------------------------------------------------------

    def poll(self) -> None:
        """Reap the jobs that ended (their devices freed, their outcome recorded); redraw the view."""
        if self.on_poll is not None:
            self.on_poll(self)
        for num, child in list(self.running.items()):
            rc = child.proc.poll()
            if rc is None:
                continue
            child.ended = time.time()
            child.outcome = read_outcome(child, rc)
            self.slots[child.kind].give(child.ids)
            del self.running[num]
            self.done[num] = child
            self.view.ended(child)
            self.on_end(child)
        self.view.draw(self.running.values(), len(self.done))

    def wait(self, num: int) -> Child | None:
        """Wait for job ``num`` (other jobs keep running and are reaped meanwhile)."""
        while num in self.running:
            self.poll()
            if num in self.running:
                time.sleep(POLL_S)
        return self.done.get(num)

    def wait_all(self) -> None:
        """Wait for every running job, then give the terminal and the signals back."""
        try:
            while self.running:
                self.poll()
                if self.running:
                    time.sleep(POLL_S)
        finally:
            self.view.close()
            restore_signals(self._old)
            self._old = {}

    def close(self) -> None:
        """Remove the pool's private files (job outcomes, consoles, logs): after the logs were kept."""
        import shutil

        shutil.rmtree(self.private, ignore_errors=True)

    # -- stopping -------------------------------------------------------------------------------------------------

    def prune(self, num: int, record: Mapping[str, Any]) -> None:
        """Stop running job ``num`` because a search's pruner said so: its prune record first (its driver then ends
        the run ``pruned``), then the stop a Ctrl-C would send (its ranks save a checkpoint and end)."""
        child = self.running.get(num)
        if child is None:
            return
        child.pruned = dict(record)
        with open(child.files["prune"], "w") as f:
            json.dump(child.pruned, f)
        try:
            os.kill(child.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass

    def _handle_signals(self) -> None:
        if not self._old:
            self._old = handle_signals((signal.SIGINT, signal.SIGTERM), self._on_signal)

    def _on_signal(self, signum: int, _frame: Any) -> None:
        again = self.stopping is not None
        self.stopping = self.stopping or signum
        n = len(self.running)
        self.view.say(f"ddp-run: sweep: {layout_signal(signum)}{' again' if again else ''}: "
                      + (f"stopping {n} running job{'s' if n != 1 else ''} at once, without the checkpoint on stop"
                         if again else f"stopping {n} running job{'s' if n != 1 else ''}: each saves a checkpoint "
                         "and ends interrupted; jobs not started yet are not run (Ctrl-C again: stop at once)"))
        for child in self.running.values():
            try:
                os.kill(child.proc.pid, signum)  # the child's driver stops its run as it would its own Ctrl-C
            except ProcessLookupError:
                pass


def layout_signal(signum: int) -> str:
    """``SIGINT``."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _visible_gpus() -> list[Any]:
    from ddp_runner.config.devices import visible_gpus

    return visible_gpus()


def _child_setup(cores: set[int] | None) -> None:  # runs in the child between fork and exec
    if cores:
        os.sched_setaffinity(0, cores)  # torchrun and its ranks inherit it
    die_with_parent(signal.SIGTERM)  # this driver gone: the job stops as on a Ctrl-C, with its checkpoint
